"""The operator reads what gymkube-eval writes: the same summary and progress fields, line
prefixes and bad-input exit code (the operator does not import gymkube-agentloop, so these tests
hold the two copies equal)."""

import pytest
from gymkube_agentloop import evaluate
from gymkube_agentloop.cli import EXIT_BAD_INPUT
from gymkube_operator.evalrun import command, models, readings
from gymkube_operator.trainingrun.command import Run

pytestmark = pytest.mark.unit


def test_both_summary_and_progress_models_have_the_same_fields() -> None:
    assert set(evaluate.EvalSummary.model_fields) == set(models.EvalSummary.model_fields)
    assert set(evaluate.TaskScore.model_fields) == set(models.TaskResult.model_fields)
    assert set(evaluate.EvalProgress.model_fields) == set(models.EvalProgress.model_fields)


def test_the_line_prefixes_and_the_bad_input_exit_code_are_the_runners() -> None:
    assert readings.PROGRESS_PREFIX == evaluate.PROGRESS_PREFIX
    assert readings.RESULT_PREFIX == evaluate.RESULT_PREFIX
    assert command.EVAL_EXIT_BAD_INPUT == EXIT_BAD_INPUT


def test_what_the_runner_writes_is_what_the_operator_reads() -> None:
    task = evaluate.TaskScore(task="frozen_lake_9001", episodes=2, successes=1, mean_score=0.5)
    summary = evaluate.EvalSummary(
        model="/checkpoints/lake-grpo/global_step_3/actor/huggingface",
        checkpoint_step=3,
        episodes=2,
        successes=1,
        success_rate=0.5,
        success_rate_interval=(0.09, 0.91),
        mean_score=0.5,
        mean_score_interval=(0.0, 1.0),
        mean_turns=2.5,
        env_errors=0,
        tasks=[task],
    )
    line = readings.RESULT_PREFIX + summary.compact_json()
    read = readings.summary(line)
    assert read is not None
    assert read.model_dump(mode="json") == summary.model_dump(mode="json")
    termination = summary.compact_json(exclude={"tasks"})
    result = models.EvalResult.model_validate_json(termination)
    assert result.checkpoint_step == 3
    progress = evaluate.EvalProgress(episodes=1, total=2, successes=1, mean_score=1.0)
    found = readings.progress(readings.PROGRESS_PREFIX + progress.compact_json())
    assert found is not None
    assert found.model_dump() == progress.model_dump()


@pytest.mark.parametrize(
    "model",
    [{"path": "/models/base"}, {"trainingRun": {"name": "lake-grpo", "step": 3}}],
    ids=["path", "checkpoint"],
)
def test_gymkube_eval_takes_the_command_the_operator_renders(model: dict[str, object]) -> None:
    spec = models.EvalRunSpec.model_validate(
        {
            "envPoolRef": {"name": "lake"},
            "model": model,
            "sampling": {"temperature": 0.7, "topP": 0.9, "samplesPerTask": 4},
        }
    )
    run = Run(
        name="score",
        namespace="rl",
        uid="uid-1",
        trainer_image="reg/trainer:1",
        cpu_trainer_image="reg/trainer-cpu:1",
        preflight_image="reg/preflight:1",
        image_pull_policy="IfNotPresent",
    )
    target = command.EvalTarget(
        run=run, spec=spec, pool_url="http://lake.rl.svc:8000", env="frozen_lake"
    )
    argv = command.eval_command(target)
    assert argv[0] == command.EVAL_RUNNER
    settings = evaluate.parse_args(argv[1:])
    assert (settings.temperature, settings.top_p, settings.samples_per_task) == (0.7, 0.9, 4)
    assert str(settings.termination_log) == command.TERMINATION_LOG
