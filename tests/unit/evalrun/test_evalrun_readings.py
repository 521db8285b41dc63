"""gymkube-eval's lines and termination message as the operator reads them."""

import json

import pytest
from gymkube_operator.evalrun import readings
from gymkube_operator.evalrun.models import EvalResult

pytestmark = pytest.mark.unit

RESULT = {
    "model": "/models/base",
    "checkpointStep": None,
    "episodes": 2,
    "successes": 1,
    "successRate": 0.5,
    "successRateInterval": [0.09, 0.91],
    "meanScore": 0.5,
    "meanScoreInterval": [0.0, 1.0],
    "meanTurns": 2.0,
    "envErrors": 0,
}


def test_the_last_well_formed_progress_line_wins() -> None:
    log = "\n".join(
        [
            'gymkube-eval-progress {"episodes": 1, "total": 2, "successes": 1, "meanScore": 1.0}',
            'gymkube-eval-progress {"episodes": 2, "total": 2, "successes": 1, "meanScore": 0.5}',
            # Cut off by the log's tail, not JSON, or what the status schema would refuse:
            'gymkube-eval-progress {"episodes": 3, "tot',
            'gymkube-eval-progress {"episodes": 3, "total": 2, "meanScore": NaN}',
            "INFO vllm: done",
        ]
    )
    found = readings.progress(log)
    assert found is not None
    assert (found.episodes, found.mean_score) == (2, 0.5)
    assert readings.progress(None) is None
    assert readings.progress("no lines of ours") is None


def test_the_result_line_carries_the_tasks() -> None:
    tasks = [{"task": "frozen_lake_1", "episodes": 2, "successes": 1, "meanScore": 0.5}]
    log = f"{readings.RESULT_PREFIX}{json.dumps(RESULT | {'tasks': tasks})}\n"
    summary = readings.summary(log)
    assert summary is not None
    assert [task.task for task in summary.tasks] == ["frozen_lake_1"]
    assert summary.checkpoint_step is None


def test_a_summary_without_its_interval_is_no_summary() -> None:
    broken = {k: v for k, v in RESULT.items() if k != "meanScoreInterval"}
    assert readings.summary(readings.RESULT_PREFIX + json.dumps(broken)) is None
    with pytest.raises(ValueError, match="at least 2 items"):
        EvalResult.model_validate(RESULT | {"meanScoreInterval": [0.5]})


def test_the_termination_message_is_the_summary_or_nothing() -> None:
    def pod(message: str) -> dict[str, object]:
        terminated = {"exitCode": 0, "message": message}
        status = {"name": "eval", "state": {"terminated": terminated}}
        return {"status": {"containerStatuses": [status]}}

    found = readings.termination_result(pod(json.dumps(RESULT) + "\n"), "eval")
    assert found is not None
    assert found.mean_score == 0.5
    assert readings.termination_result(pod("Traceback ..."), "eval") is None
    assert readings.termination_result(None, "eval") is None
