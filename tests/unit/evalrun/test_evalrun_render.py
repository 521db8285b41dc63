"""The pure builders: an EvalRun becomes the ConfigMap and Job a user expects, with the
TrainingRun's own dataset step, agent-loop YAML and device settings."""

import json
from typing import Any

import pytest
import yaml
from gymkube_operator.evalrun import command, render
from gymkube_operator.evalrun.command import EvalTarget
from gymkube_operator.evalrun.models import MAX_TASKS, EvalRunSpec, EvalSummary
from gymkube_operator.trainingrun import command as training
from gymkube_operator.trainingrun import device
from gymkube_operator.trainingrun.command import Run, RunTarget
from gymkube_operator.trainingrun.models import TrainingRunSpec

pytestmark = pytest.mark.unit

POOL_URL = "http://lake.rl.svc:8000"
RUN = Run(
    name="score",
    namespace="rl",
    uid="uid-1",
    trainer_image="reg/trainer:1",
    cpu_trainer_image="reg/trainer-cpu:1",
    preflight_image="reg/preflight:1",
    image_pull_policy="Always",
)
CHECKPOINTS = {"persistentVolumeClaim": {"claimName": "checkpoints"}}
TRAINING_AGENT_LOOP = {"maxTurns": 3, "promptTemplate": "frozen_lake", "maxResponseTokens": 512}


def eval_spec(**fields: Any) -> EvalRunSpec:
    return EvalRunSpec.model_validate(
        {"envPoolRef": {"name": "lake"}, "model": {"path": "/models/base"}, **fields}
    )


def training_run(**fields: Any) -> TrainingRunSpec:
    return TrainingRunSpec.model_validate(
        {
            "envPoolRef": {"name": "lake"},
            "model": {"path": "/models/base"},
            "device": "cpu",
            "agentLoop": TRAINING_AGENT_LOOP,
            "checkpoints": CHECKPOINTS,
            **fields,
        }
    )


def target(spec: EvalRunSpec, trained: TrainingRunSpec | None = None) -> EvalTarget:
    return EvalTarget(
        run=RUN, spec=spec, pool_url=POOL_URL, env="frozen_lake", training_run=trained
    )


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def pod_of(job: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = job["spec"]["template"]["spec"]
    return pod


def test_a_path_model_is_a_job_owned_by_the_eval_running_gymkube_eval() -> None:
    spec = eval_spec(backoffLimit=1, activeDeadlineSeconds=900, dataset={"size": 16, "seed": 7})
    job = render.eval_job(target(spec))
    meta = job["metadata"]
    assert (meta["name"], meta["namespace"]) == ("score-eval", "rl")
    (ref,) = meta["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
        "EvalRun",
        "score",
        "uid-1",
        True,
    )
    assert meta["labels"]["gymkube.io/evalrun"] == "score"
    # The pool's NetworkPolicy lets its clients in by this label.
    assert job["spec"]["template"]["metadata"]["labels"]["gymkube.io/envpool-client"] == "lake"
    assert (job["spec"]["backoffLimit"], job["spec"]["activeDeadlineSeconds"]) == (1, 900)
    pod = pod_of(job)
    assert pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    argv = container["command"]
    assert argv[0] == "gymkube-eval"
    assert flag(argv, "--env-url") == POOL_URL
    assert flag(argv, "--env") == "frozen_lake"
    assert flag(argv, "--rows") == command.ROWS_FILE
    assert flag(argv, "--agent-loop-config") == training.AGENT_LOOP_PATH
    assert flag(argv, "--model") == "/models/base"
    assert "--checkpoints" not in argv
    assert (flag(argv, "--seed"), flag(argv, "--device")) == ("7", "gpu")
    assert flag(argv, "--termination-log") == "/dev/termination-log"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert container["resources"]["limits"] == {device.GPU_RESOURCE: 1}
    assert container["image"] == "reg/trainer:1"


def test_the_rows_come_from_the_trainingruns_own_dataset_step() -> None:
    spec = eval_spec(dataset={"split": "dev", "size": 16, "seed": 7})
    evaluated = target(spec)
    (init,) = pod_of(render.eval_job(evaluated))["initContainers"]
    as_training = evaluated.as_training()
    assert init["command"] == training.dataset_command(
        as_training, split="dev", size=16, out=command.ROWS_FILE
    )
    assert flag(init["command"], "--seed") == "7"
    assert {m["name"] for m in init["volumeMounts"]} == {"data", "agent-loop"}


def test_sampling_and_token_limits_reach_gymkube_eval() -> None:
    spec = eval_spec(
        sampling={"temperature": 0.7, "topP": 0.9, "samplesPerTask": 4},
        agentLoop={"maxPromptTokens": 1024, "maxResponseTokens": 256},
    )
    argv = command.eval_command(target(spec))
    assert flag(argv, "--temperature") == "0.7"
    assert flag(argv, "--top-p") == "0.9"
    assert flag(argv, "--samples-per-task") == "4"
    assert (flag(argv, "--max-prompt-tokens"), flag(argv, "--max-response-tokens")) == (
        "1024",
        "256",
    )


def test_a_checkpoint_mounts_the_trainingruns_volume_read_only_and_plays_as_it_trained() -> None:
    spec = eval_spec(model={"trainingRun": {"name": "lake-grpo", "step": 3}})
    evaluated = target(spec, training_run())
    job = render.eval_job(evaluated)
    pod = pod_of(job)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["checkpoints"] == {"name": "checkpoints", **CHECKPOINTS}
    (container,) = pod["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["checkpoints"] == {
        "name": "checkpoints",
        "mountPath": training.CHECKPOINTS_DIR,
        "readOnly": True,
    }
    argv = container["command"]
    assert flag(argv, "--checkpoints") == training.checkpoint_dir("lake-grpo")
    assert flag(argv, "--step") == "3"
    assert "--model" not in argv
    # The TrainingRun's agent loop and device, as the eval set neither.
    assert flag(argv, "--max-response-tokens") == "512"
    assert flag(argv, "--device") == "cpu"
    assert container["image"] == "reg/trainer-cpu:1"
    assert device.GPU_RESOURCE not in container["resources"]["limits"]
    assert {e["name"]: e["value"] for e in container["env"]}.items() >= device.CPU_ENV.items()
    loop = yaml.safe_load(render.config_map(evaluated)["data"][training.AGENT_LOOP_FILE])
    assert (loop[0]["max_turns"], loop[0]["prompt_template"]) == (3, "frozen_lake")


def test_the_latest_checkpoint_is_asked_for_by_name() -> None:
    spec = eval_spec(model={"trainingRun": {"name": "lake-grpo"}})
    argv = command.eval_command(target(spec, training_run()))
    assert flag(argv, "--step") == "latest"


def test_the_evals_own_agent_loop_and_device_win_over_the_trainingruns() -> None:
    spec = eval_spec(
        model={"trainingRun": {"name": "lake-grpo"}}, agentLoop={"maxTurns": 9}, device="gpu"
    )
    evaluated = target(spec, training_run())
    assert evaluated.agent_loop.max_turns == 9
    argv = command.eval_command(evaluated)
    assert flag(argv, "--device") == "gpu"


def test_the_agent_loop_yaml_is_the_trainingruns_rendering() -> None:
    spec = eval_spec(agentLoop={"maxTurns": 5, "templates": {"terse": {"system": "s"}}})
    evaluated = target(spec)
    config_map = render.config_map(evaluated)
    assert config_map["metadata"]["name"] == "score-eval-config"
    data = config_map["data"]
    rendered = RunTarget(
        run=RUN,
        spec=evaluated.as_training().spec,
        pool_url=POOL_URL,
        env="frozen_lake",
    )
    assert data[training.AGENT_LOOP_FILE] == yaml.safe_dump(
        training.agent_loop_config(rendered), sort_keys=False
    )
    assert training.TEMPLATES_FILE in data
    assert training.SETTINGS_FILE not in data  # the verl command a TrainingRun keeps there
    settings = yaml.safe_load(data[command.SETTINGS_FILE])
    assert settings["command"] == command.eval_command(evaluated)
    pod = pod_of(render.eval_job(evaluated))
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["agent-loop"]["configMap"]["name"] == "score-eval-config"
    (init,) = pod["initContainers"]
    assert flag(init["command"], "--templates") == training.TEMPLATES_PATH


def test_a_model_volume_is_mounted_read_only() -> None:
    spec = eval_spec(
        model={"path": "/models/q/7b", "volume": {"persistentVolumeClaim": {"claimName": "m"}}}
    )
    pod = pod_of(render.eval_job(target(spec)))
    (container,) = pod["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["model"] == {"name": "model", "mountPath": "/models", "readOnly": True}
    assert "checkpoints" not in mounts


def test_a_missing_model_fails_the_job_at_once() -> None:
    rules = render.eval_job(target(eval_spec()))["spec"]["podFailurePolicy"]["rules"]
    fail = [r for r in rules if r["action"] == "FailJob"]
    assert fail == [
        {
            "action": "FailJob",
            "onExitCodes": {
                "containerName": render.EVAL,
                "operator": "In",
                "values": [command.EVAL_EXIT_BAD_INPUT],
            },
        }
    ]


SUMMARY: dict[str, Any] = {
    "model": "/checkpoints/lake-grpo/global_step_3/actor/huggingface",
    "checkpointStep": 3,
    "episodes": 4,
    "successes": 1,
    "successRate": 0.25,
    "successRateInterval": [0.05, 0.7],
    "meanScore": 0.25,
    "meanScoreInterval": [0.0, 0.74],
    "meanTurns": 2.5,
    "envErrors": 0,
    "tasks": [
        {"task": "frozen_lake_3", "episodes": 2, "successes": 1, "meanScore": 0.5},
        {"task": "frozen_lake_8", "episodes": 2, "successes": 0, "meanScore": 0.0},
    ],
}


def test_the_results_config_map_holds_the_tasks_and_is_owned_by_the_eval() -> None:
    summary = EvalSummary.model_validate(SUMMARY)
    config_map = render.results_config_map(RUN, eval_spec(), summary)
    assert config_map["metadata"]["name"] == "score-results"
    assert config_map["metadata"]["ownerReferences"][0]["kind"] == "EvalRun"
    data = config_map["data"]
    assert json.loads(data[render.TASKS_FILE]) == SUMMARY["tasks"]
    assert len(data[render.TASKS_FILE].splitlines()) == len(SUMMARY["tasks"]) + 2
    assert json.loads(data[render.SUMMARY_FILE]) == {
        k: v for k, v in SUMMARY.items() if k != "tasks"
    }


def test_the_per_task_results_of_the_most_tasks_fit_a_config_map() -> None:
    task = {"task": "sciworld_" + "9" * 40, "episodes": 1024, "successes": 1024, "meanScore": 1.0}
    summary = EvalSummary.model_validate(SUMMARY | {"tasks": [task] * MAX_TASKS})
    data = render.results_config_map(RUN, eval_spec(), summary)["data"]
    assert sum(len(text.encode()) for text in data.values()) < 1024 * 1024 * 0.8
