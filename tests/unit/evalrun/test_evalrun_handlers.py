"""When an eval's daemon reconciles next, and that the operator registers it."""

import pytest
from gymkube_operator.evalrun import handlers
from gymkube_operator.evalrun.lifecycle import Plan
from gymkube_operator.evalrun.models import EvalRunStatus, Phase
from gymkube_operator.main import build_registry
from gymkube_operator.runtime import UNTIL_WOKEN, Runtime
from gymkube_operator.settings import OperatorSettings

pytestmark = pytest.mark.unit

SETTINGS = OperatorSettings(trainingrun_resync_seconds=30, trainingrun_progress_seconds=10)


def test_a_playing_eval_reads_its_log_often_and_a_waiting_one_resyncs() -> None:
    playing = Plan(status=EvalRunStatus(phase=Phase.RUNNING))
    assert handlers.next_pass(SETTINGS, playing) == 10
    waiting = Plan(status=EvalRunStatus(phase=Phase.WAITING_FOR_ENV_POOL))
    assert handlers.next_pass(SETTINGS, waiting) == 30


def test_a_finished_eval_sleeps_until_edited_or_its_ttl() -> None:
    finished = Plan(status=EvalRunStatus(phase=Phase.FAILED))
    assert handlers.next_pass(SETTINGS, finished) == 30  # no Failed condition: not finished
    deleted = Plan(status=EvalRunStatus(), delete_expired=True)
    assert handlers.next_pass(SETTINGS, deleted) is None
    assert handlers.next_pass(SETTINGS, None) is None
    due = Plan(status=EvalRunStatus(), wake_after=5)
    assert handlers.next_pass(SETTINGS, due) == 5


def test_a_finished_eval_without_a_ttl_waits_for_an_edit() -> None:
    status = EvalRunStatus.model_validate(
        {
            "phase": "Succeeded",
            "conditions": [
                {
                    "type": "Succeeded",
                    "status": "True",
                    "reason": "EvalSucceeded",
                    "lastTransitionTime": "2026-05-01T12:00:00Z",
                }
            ],
        }
    )
    assert handlers.next_pass(SETTINGS, Plan(status=status)) == UNTIL_WOKEN


def test_the_operator_runs_a_daemon_per_eval() -> None:
    registry = build_registry(Runtime(settings=SETTINGS))
    daemons = {h.id for h in registry._spawning.get_all_handlers()}
    assert "evalrun_daemon" in daemons, daemons
    watchers = {str(h) for h in registry._watching.get_all_handlers()}
    assert {f"Handler {name!r}" for name in handlers.EVAL_WAKERS} <= watchers
