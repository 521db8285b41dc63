"""Pure builders of an EvalRun's children: the agent-loop ConfigMap, the eval Job, and the
per-task results ConfigMap. Plain dicts, applied as they are by server-side apply."""

import json

from gymkube_operator.evalrun import command
from gymkube_operator.evalrun.command import EvalTarget
from gymkube_operator.evalrun.models import KIND, EvalRunSpec, EvalSummary
from gymkube_operator.labels import COMPONENT_LABEL, EVAL_RUN_LABEL, POOL_CLIENT_LABEL
from gymkube_operator.objects import Object, Owner
from gymkube_operator.trainingrun import command as training
from gymkube_operator.trainingrun import render as training_render
from gymkube_operator.trainingrun.command import Run

EVAL = "eval"
DATASET = "dataset"
JOB_API = training_render.JOB_API
TASKS_FILE = "tasks.json"
SUMMARY_FILE = "summary.json"


def labels(name: str, pool: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "gymkube",
        "app.kubernetes.io/managed-by": "gymkube-operator",
        COMPONENT_LABEL: EVAL,
        EVAL_RUN_LABEL: name,
        # The pool's NetworkPolicy lets in the pods that carry it.
        POOL_CLIENT_LABEL: pool,
    }


def job_name(name: str) -> str:
    return f"{name}-eval"


def config_map_name(name: str) -> str:
    return f"{name}-eval-config"


def results_config_map_name(name: str) -> str:
    return f"{name}-results"


def _metadata(run: Run, spec: EvalRunSpec, name: str) -> Object:
    owner = Owner(kind=KIND, name=run.name, namespace=run.namespace, uid=run.uid)
    return owner.metadata(name, labels(run.name, spec.env_pool_ref.name))


def config_map(target: EvalTarget) -> Object:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(target.run, target.spec, config_map_name(target.name)),
        "data": command.config_files(target),
    }


def _volumes(target: EvalTarget) -> tuple[list[Object], list[Object]]:
    """(volumes, mounts) of the eval pod: rows, shm, the agent-loop ConfigMap, and the model's."""
    spec = target.spec
    volumes: list[Object] = [
        {"name": "data", "emptyDir": {}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}},
        training_render.CONFIG_VOLUME | {"configMap": {"name": config_map_name(target.name)}},
    ]
    mounts: list[Object] = [
        {"name": "data", "mountPath": training.DATA_DIR},
        {"name": "shm", "mountPath": "/dev/shm"},
        training_render.CONFIG_MOUNT,
    ]
    checkpoints = target.training_run.checkpoints if target.training_run is not None else None
    if spec.model.training_run is not None and checkpoints is not None:
        volumes.append({"name": "checkpoints", **checkpoints})
        mounts.append(
            {"name": "checkpoints", "mountPath": training.CHECKPOINTS_DIR, "readOnly": True}
        )
    if spec.model.volume is not None:
        volumes.append({"name": "model", **spec.model.volume})
        mounts.append({"name": "model", "mountPath": spec.model.mount_path, "readOnly": True})
    return volumes, mounts


def dataset_container(target: EvalTarget, mounts: list[Object]) -> Object:
    """The init container writing the eval's rows, as a TrainingRun's dataset steps do."""
    as_training = target.as_training()
    wanted = ("data", training_render.CONFIG_VOLUME["name"])
    return {
        "name": DATASET,
        "image": as_training.trainer_image,
        "imagePullPolicy": as_training.image_pull_policy,
        "command": command.dataset_command(target),
        # gymkube-dataset's last lines say why it failed (a bad template, an unreachable pool).
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "env": [{"name": training.ENV_URL_VAR, "value": target.pool_url}],
        "volumeMounts": [m for m in mounts if m["name"] in wanted],
    }


# A disruption (eviction, preemption, a lost node) retries without counting; a missing model or
# checkpoint fails the Job at once whatever its backoffLimit.
EVAL_FAILURE_POLICY: Object = {
    "rules": [
        {
            "action": "Ignore",
            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
        },
        {
            "action": "FailJob",
            "onExitCodes": {
                "containerName": EVAL,
                "operator": "In",
                "values": [command.EVAL_EXIT_BAD_INPUT],
            },
        },
    ]
}


def eval_job(target: EvalTarget) -> Object:
    """The eval Job: the dataset step, then gymkube-eval in the trainer container's shape (the
    device's environment and limits: on gpu one nvidia.com/gpu)."""
    spec = target.spec
    volumes, mounts = _volumes(target)
    fields = {
        "command": command.eval_command(target),
        # gymkube-eval writes its summary or its reason; should it not (a crash before it
        # starts), the log tail explains instead.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    container = training_render.trainer_container(target.as_training(), EVAL, mounts, fields)
    pod: Object = {
        "restartPolicy": "Never",
        "securityContext": {
            "fsGroup": training_render.IMAGE_UID,
            "fsGroupChangePolicy": "OnRootMismatch",
        },
        "initContainers": [dataset_container(target, mounts)],
        "containers": [container],
        "volumes": volumes,
    }
    metadata = _metadata(target.run, target.spec, job_name(target.name))
    job_spec: Object = {
        "backoffLimit": spec.backoff_limit,
        "podFailurePolicy": EVAL_FAILURE_POLICY,
        # The next pod starts only once the last one has stopped (what a podFailurePolicy implies).
        "podReplacementPolicy": "Failed",
        "completions": 1,
        "parallelism": 1,
        "template": {"metadata": {"labels": metadata["labels"]}, "spec": pod},
    }
    if spec.active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = spec.active_deadline_seconds
    return {"apiVersion": JOB_API, "kind": "Job", "metadata": metadata, "spec": job_spec}


def results_config_map(run: Run, spec: EvalRunSpec, summary: EvalSummary) -> Object:
    """The per-task results (tasks.json, one task a line) and the rest of the summary
    (summary.json), owned by the EvalRun."""
    tasks = [json.dumps(task.model_dump(by_alias=True, mode="json")) for task in summary.tasks]
    rest = summary.model_dump(by_alias=True, mode="json", exclude={"tasks"})
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(run, spec, results_config_map_name(run.name)),
        "data": {
            TASKS_FILE: "[\n" + ",\n".join(tasks) + "\n]\n",
            SUMMARY_FILE: json.dumps(rest, indent=1),
        },
    }
