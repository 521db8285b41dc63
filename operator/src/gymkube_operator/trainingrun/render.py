"""Pure builders of a TrainingRun's children: the preflight Job, the ConfigMap, the training Job or
RayJob. Plain dicts, applied as they are by server-side apply."""

from typing import Any

from gymkube_operator.labels import (
    COMPONENT_LABEL,
    POOL_CLIENT_LABEL,
    RUN_LABEL,
    pool_client_label,
)
from gymkube_operator.objects import (
    RESTRICTED_CONTAINER,
    RESTRICTED_POD,
    Object,
    Owner,
    merge,
)
from gymkube_operator.trainingrun import command, device
from gymkube_operator.trainingrun.command import RunTarget, ServedPool
from gymkube_operator.trainingrun.models import KIND

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
PREFLIGHT = "preflight"
TRAINER = "trainer"

JOB_API = "batch/v1"
RAYJOB_API = "ray.io/v1"
RAY_WORKER_GROUP = "workers"
# The user the gymkube images run as; fsGroup makes the checkpoints volume writable for it.
IMAGE_UID = 10001

PREFLIGHT_RESOURCES: Object = {
    "requests": {"cpu": "250m", "memory": "256Mi"},
    "limits": {"memory": "1Gi"},
}


def owner(target: RunTarget) -> Owner:
    return Owner(kind=KIND, name=target.name, namespace=target.namespace, uid=target.uid)


def labels(target: RunTarget, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "gymkube",
        "app.kubernetes.io/managed-by": "gymkube-operator",
        COMPONENT_LABEL: component,
        RUN_LABEL: target.name,
        POOL_CLIENT_LABEL: target.spec.pools()[0].name,
        **{pool_client_label(pool.name): "true" for pool in target.pools},
    }


def config_map_name(run: str) -> str:
    return f"{run}-agent-loop"


def preflight_job_name(run: str) -> str:
    return f"{run}-preflight"


def training_name(run: str) -> str:
    return f"{run}-train"


def training_api_version(nodes: int) -> tuple[str, str]:
    """(apiVersion, kind) of the training child: a Job on one node, a RayJob on several."""
    return (JOB_API, "Job") if nodes == 1 else (RAYJOB_API, "RayJob")


# The run's ConfigMap (agent-loop YAML, templates) as every pod that reads it mounts it.
CONFIG_VOLUME: Object = {"name": "agent-loop"}
CONFIG_MOUNT: Object = {"name": "agent-loop", "mountPath": command.CONFIG_DIR, "readOnly": True}
# customAgentLoop.configMap, the user's own loop code.
CUSTOM_LOOP_VOLUME = "custom-agent-loop"


def config_map(target: RunTarget) -> Object:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": owner(target).metadata(config_map_name(target.name), labels(target, TRAINER)),
        "data": command.config_files(target),
    }


def preflight_container(pool: str | None) -> str:
    """The preflight container playing POOL (with envPools; None: the run's one pool)."""
    return f"{PREFLIGHT}-{pool}" if pool else PREFLIGHT


def preflight_job(target: RunTarget) -> Object:
    """A CPU-only Job playing scripted episodes through the pool URL (with envPools, a container
    per pool, side by side); never queued or retried."""
    preflight = target.spec.preflight
    job_labels = labels(target, PREFLIGHT)
    volumes: list[Object] = [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]
    mounts: list[Object] = [{"name": "tmp", "mountPath": "/tmp"}]
    if target.spec.agent_loop.templates:
        # The run's own prompt templates (--templates) come from its ConfigMap.
        volumes.append(CONFIG_VOLUME | {"configMap": {"name": config_map_name(target.name)}})
        mounts.append(CONFIG_MOUNT)
    pools: list[ServedPool | None] = list(target.pools) or [None]
    containers = [
        {
            "name": preflight_container(pool.name if pool else None),
            "image": target.preflight_image,
            "imagePullPolicy": target.image_pull_policy,
            "command": command.preflight_command(target, pool),
            "env": [{"name": command.ENV_URL_VAR, "value": pool.url if pool else target.pool_url}],
            "resources": PREFLIGHT_RESOURCES,
            "securityContext": RESTRICTED_CONTAINER,
            # Should the summary never be written (a crash), the log tail explains instead.
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "volumeMounts": mounts,
        }
        for pool in pools
    ]
    return {
        "apiVersion": JOB_API,
        "kind": "Job",
        "metadata": owner(target).metadata(preflight_job_name(target.name), job_labels),
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": preflight.active_deadline_seconds,
            "template": {
                "metadata": {"labels": job_labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "securityContext": RESTRICTED_POD,
                    "containers": containers,
                    "volumes": volumes,
                },
            },
        },
    }


def _volumes(target: RunTarget) -> tuple[list[Object], list[Object]]:
    """(volumes, mounts) every trainer container shares."""
    spec = target.spec
    volumes: list[Object] = [
        {"name": "data", "emptyDir": {}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}},
        CONFIG_VOLUME | {"configMap": {"name": config_map_name(target.name)}},
        {"name": "checkpoints", **(spec.checkpoints or {"emptyDir": {}})},
    ]
    mounts: list[Object] = [
        {"name": "data", "mountPath": command.DATA_DIR},
        {"name": "shm", "mountPath": "/dev/shm"},
        CONFIG_MOUNT,
        {"name": "checkpoints", "mountPath": command.CHECKPOINTS_DIR},
    ]
    if spec.model.volume is not None:
        volumes.append({"name": "model", **spec.model.volume})
        mounts.append({"name": "model", "mountPath": spec.model.mount_path, "readOnly": True})
    custom = spec.custom_agent_loop
    if custom is not None and custom.config_map is not None:
        volumes.append({"name": CUSTOM_LOOP_VOLUME, "configMap": {"name": custom.config_map}})
        mounts.append(
            {"name": CUSTOM_LOOP_VOLUME, "mountPath": command.CUSTOM_LOOP_DIR, "readOnly": True}
        )
    return volumes, mounts


def _env(target: RunTarget) -> list[Object]:
    """The pool URL(s) as gymkube's steps and users' loops read them: GYMKUBE_ENV_URL and
    <ENV>_ENV_BASE (the first pool serving that env), and GYMKUBE_ENV_URL_<POOL> per pool."""
    served = [(pool.name, pool.url, pool.env) for pool in target.pools]
    bases: dict[str, str] = {}
    for _, url, env in served or [("", target.pool_url, target.env)]:
        bases.setdefault(command.env_base_var(env), url)
    return [
        {"name": command.ENV_URL_VAR, "value": target.pool_url},
        *({"name": name, "value": url} for name, url in bases.items()),
        *({"name": command.pool_url_var(name), "value": url} for name, url, _ in served),
    ]


def _trainer_env(target: RunTarget) -> list[Object]:
    custom = target.spec.custom_agent_loop
    if custom is None or custom.config_map is None:
        return []
    # The image sets no PYTHONPATH of its own, so this one is the whole of it.
    return [{"name": "PYTHONPATH", "value": command.CUSTOM_LOOP_DIR}]


def dataset_containers(target: RunTarget, mounts: list[Object]) -> list[Object]:
    """Init containers writing verl's train and validation parquet into /data.

    On a RayJob every node runs them: the same seed gives the same rows, so no shared volume is
    needed for the dataset whichever node verl reads it on.
    """
    # The data volume to write, and the ConfigMap for the run's own prompt templates.
    data_mount = [m for m in mounts if m["name"] in ("data", CONFIG_VOLUME["name"])]
    return [
        {
            "name": name,
            "image": target.trainer_image,
            "imagePullPolicy": target.image_pull_policy,
            "command": args,
            "env": _env(target),
            "volumeMounts": data_mount,
        }
        for name, args in command.dataset_commands(target).items()
    ]


def trainer_container(
    target: RunTarget,
    name: str,
    mounts: list[Object],
    fields: Object,
    env: tuple[Object, ...] = (),
) -> Object:
    """The trainer container: the device's environment and limits and `env`, then `fields` (a
    command, probes)."""
    spec = target.spec
    resources = spec.resources.to_api()
    limits = {**resources.get("limits", {}), **device.limits(spec)}
    container: Object = {
        "name": name,
        "image": target.trainer_image,
        "imagePullPolicy": target.image_pull_policy,
        "env": _env(target)
        + _trainer_env(target)
        + command.trainer_env(target.name, spec)
        + device.env(spec.device)
        + list(env),
        "resources": {**resources, "limits": limits},
        "volumeMounts": mounts,
    }
    return container | fields


def trainer_pod_spec(
    target: RunTarget, container_name: str, fields: Object, env: tuple[Object, ...] = ()
) -> Object:
    """A trainer pod: dataset init containers, then the trainer; podTemplate merged last."""
    volumes, mounts = _volumes(target)
    pod: Object = {
        "securityContext": {"fsGroup": IMAGE_UID, "fsGroupChangePolicy": "OnRootMismatch"},
        "initContainers": dataset_containers(target, mounts),
        "containers": [trainer_container(target, container_name, mounts, fields, env)],
        "volumes": volumes,
    }
    merged: Object = merge(pod, target.spec.pod_template)
    return merged


def _child_metadata(target: RunTarget) -> Object:
    meta = owner(target).metadata(training_name(target.name), labels(target, TRAINER))
    if target.spec.queue_name:
        meta["labels"][QUEUE_LABEL] = target.spec.queue_name
    if target.spec.workload_priority_class:
        meta["labels"][PRIORITY_LABEL] = target.spec.workload_priority_class
    return meta


def _starts_suspended(target: RunTarget) -> bool:
    # Kueue admits a queued workload by unsuspending it, so it is created suspended.
    return target.spec.suspend or target.spec.queue_name is not None


# How the training Job tells a disruption from the trainer's own failure. A disruption retries
# without counting against backoffLimit (and resumes from the newest checkpoint); the trainer's
# errors count (backoffLimit 0: the first fails the run), and a bad input fails it at once.
TRAINER_FAILURE_POLICY: Object = {
    "rules": [
        # Evicted (a drain), preempted, its node lost or tainted, node pressure or shutdown.
        {
            "action": "Ignore",
            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
        },
        # A plain pod deletion sets no DisruptionTarget: gymkube-train exits with this on SIGTERM.
        {
            "action": "Ignore",
            "onExitCodes": {
                "containerName": TRAINER,
                "operator": "In",
                "values": [command.TRAINER_EXIT_STOPPED],
            },
        },
        {
            "action": "FailJob",
            "onExitCodes": {
                "containerName": TRAINER,
                "operator": "In",
                "values": [command.TRAINER_EXIT_BAD_INPUT],
            },
        },
    ]
}


def training_job(target: RunTarget) -> Object:
    spec = target.spec
    trainer = {
        "command": command.trainer_command(target),
        # gymkube-train writes the trainer's last error line; should it not (a crash before it
        # starts), the log tail explains instead.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod = trainer_pod_spec(target, TRAINER, trainer)
    # A podFailurePolicy needs it; a failed trainer is retried in a new pod, not restarted in place.
    pod["restartPolicy"] = "Never"
    job_spec: Object = {
        "backoffLimit": spec.backoff_limit,
        "podFailurePolicy": TRAINER_FAILURE_POLICY,
        # The next trainer pod starts only once the last one has stopped: two trainers never
        # write the same checkpoints (what a podFailurePolicy implies; said so it stays so).
        "podReplacementPolicy": "Failed",
        "completions": 1,
        "parallelism": 1,
        "suspend": _starts_suspended(target),
        "template": {"metadata": {"labels": labels(target, TRAINER)}, "spec": pod},
    }
    if spec.active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = spec.active_deadline_seconds
    return {
        "apiVersion": JOB_API,
        "kind": "Job",
        "metadata": _child_metadata(target),
        "spec": job_spec,
    }


# Ray's health endpoints, as KubeRay's own probes check them (its probes run wget, which the
# gymkube images do not carry): the head's GCS through its dashboard, each node's raylet through
# its dashboard agent.
RAY_HEAD_HEALTH: Object = {"path": "/api/gcs_healthz", "port": 8265}
RAY_NODE_HEALTH: Object = {"path": "/api/local_raylet_healthz", "port": 52365}
# KubeRay's timings; a node is restarted only after 10 minutes without an answer: a busy CPU node
# answers slowly, and a restarted head ends the run.
RAY_READINESS: Object = {"initialDelaySeconds": 10, "periodSeconds": 5, "timeoutSeconds": 5}
RAY_LIVENESS: Object = {
    "initialDelaySeconds": 30,
    "periodSeconds": 5,
    "timeoutSeconds": 5,
    "failureThreshold": 120,
}
# The pod KubeRay runs `ray job submit` and `ray job logs --follow` in: its log is the trainer's.
SUBMITTER_RESOURCES: Object = {
    "requests": {"cpu": "50m", "memory": "256Mi"},
    "limits": {"memory": "1Gi"},
}


def _ray_probes(health: Object) -> Object:
    return {
        "readinessProbe": {"httpGet": health, **RAY_READINESS},
        "livenessProbe": {"httpGet": health, **RAY_LIVENESS},
    }


# The RayJob's run files (command.RAY_RUN_FILES) in every Ray node's environment.
RAY_NODE_ENV: tuple[Object, ...] = tuple(
    {"name": name, "value": value} for name, value in command.RAY_RUN_FILES.items()
)


def submitter_pod_template(target: RunTarget) -> Object:
    """KubeRay's submitter pod (K8sJobMode), named like a Job's trainer so that the run reads its
    log, its progress and its last error line the same way."""
    return {
        "metadata": {"labels": labels(target, TRAINER)},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": RESTRICTED_POD,
            "containers": [
                {
                    "name": TRAINER,
                    "image": target.trainer_image,
                    "imagePullPolicy": target.image_pull_policy,
                    "resources": SUBMITTER_RESOURCES,
                    "securityContext": RESTRICTED_CONTAINER,
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                }
            ],
        },
    }


def training_rayjob(target: RunTarget) -> Object:
    """A KubeRay RayJob: a head and nodes-1 workers alike; the head runs gymkube-train and verl's
    driver, and KubeRay's submitter pod follows its log."""
    spec = target.spec
    pod_labels = labels(target, TRAINER)
    workers = spec.nodes - 1
    ray_params = device.ray_start_params(spec.device)
    ray_spec: Object = {
        "entrypoint": command.ray_entrypoint(target),
        "shutdownAfterJobFinishes": True,
        # The Ray cluster holds the nodes; it goes as soon as the job ends.
        "ttlSecondsAfterFinished": 0,
        "backoffLimit": spec.backoff_limit,
        "suspend": _starts_suspended(target),
        "submitterPodTemplate": submitter_pod_template(target),
        "rayClusterSpec": {
            "headGroupSpec": {
                "rayStartParams": {"dashboard-host": "0.0.0.0", **ray_params},
                "template": {
                    "metadata": {"labels": pod_labels},
                    "spec": trainer_pod_spec(
                        target, "ray-head", _ray_probes(RAY_HEAD_HEALTH), RAY_NODE_ENV
                    ),
                },
            },
            "workerGroupSpecs": [
                {
                    "groupName": RAY_WORKER_GROUP,
                    "replicas": workers,
                    "minReplicas": workers,
                    "maxReplicas": workers,
                    "rayStartParams": dict(ray_params),
                    "template": {
                        "metadata": {"labels": pod_labels},
                        "spec": trainer_pod_spec(
                            target, "ray-worker", _ray_probes(RAY_NODE_HEALTH), RAY_NODE_ENV
                        ),
                    },
                }
            ],
        },
    }
    if spec.active_deadline_seconds is not None:
        ray_spec["activeDeadlineSeconds"] = spec.active_deadline_seconds
    return {
        "apiVersion": RAYJOB_API,
        "kind": "RayJob",
        "metadata": _child_metadata(target),
        "spec": ray_spec,
    }


def training_child(target: RunTarget) -> Object:
    return training_job(target) if target.spec.nodes == 1 else training_rayjob(target)


def child_suspended(child: Object) -> bool:
    suspended: Any = child.get("spec", {}).get("suspend", False)
    return bool(suspended)
