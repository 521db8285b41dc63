"""The pure builders: a TrainingRun becomes the preflight Job, ConfigMap and Job or RayJob a
user expects."""

import copy
import shlex
from typing import Any

import pytest
from gymkube_operator.trainingrun import command, device, render
from gymkube_operator.trainingrun.command import Run, RunTarget
from gymkube_operator.trainingrun.models import TrainingRunSpec

pytestmark = pytest.mark.unit

POOL_URL = "http://sciworld.rl.svc:8000"


def target(**fields: Any) -> RunTarget:
    spec = TrainingRunSpec.model_validate(
        {
            "envPoolRef": {"name": "sciworld"},
            "model": {
                "path": "/models/Qwen2.5-7B-Instruct",
                "volume": {"persistentVolumeClaim": {"claimName": "models"}},
            },
            **fields,
        }
    )
    run = Run(
        name="grpo",
        namespace="rl",
        uid="uid-1",
        trainer_image="reg/trainer:1",
        cpu_trainer_image="reg/trainer:1",
        preflight_image="reg/preflight:1",
        image_pull_policy="Always",
    )
    return RunTarget(run=run, spec=spec, pool_url=POOL_URL, env="sciworld")


def by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in items}


def test_one_node_is_a_batch_job_owned_by_the_run() -> None:
    job = render.training_child(target(gpusPerNode=4, backoffLimit=2, activeDeadlineSeconds=600))
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    meta = job["metadata"]
    assert (meta["name"], meta["namespace"]) == ("grpo-train", "rl")
    (ref,) = meta["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
        "TrainingRun",
        "grpo",
        "uid-1",
        True,
    )
    spec = job["spec"]
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"], spec["suspend"]) == (2, 600, False)
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (trainer,) = pod["containers"]
    assert trainer["command"] == command.trainer_command(target(gpusPerNode=4))
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert trainer["imagePullPolicy"] == "Always"
    assert {"name": "GYMKUBE_ENV_URL", "value": POOL_URL} in trainer["env"]


def test_a_one_node_trainer_runs_verl_through_gymkube_train() -> None:
    run = target(gpusPerNode=2)
    (trainer,) = render.training_job(run)["spec"]["template"]["spec"]["containers"]
    assert trainer["command"] == [
        "gymkube-train",
        "--checkpoint-dir",
        "/checkpoints/grpo",
        "--model-path",
        "/models/Qwen2.5-7B-Instruct",
        "--",
        *command.verl_command(run),
    ]
    # gymkube-train writes the trainer's last error line; a crash before it falls back to logs.
    assert trainer["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_disruptions_retry_uncounted_and_the_trainers_own_errors_count() -> None:
    for run in (target(), target(queueName="gpu-queue"), target(backoffLimit=3)):
        spec = render.training_job(run)["spec"]
        # What a podFailurePolicy needs; the next trainer pod starts once the last one stopped.
        assert spec["template"]["spec"]["restartPolicy"] == "Never"
        assert spec["podReplacementPolicy"] == "Failed"
        disrupted, deleted, bad_input = spec["podFailurePolicy"]["rules"]
        # Evicted, preempted, node lost: Kubernetes marks the pod DisruptionTarget.
        assert disrupted == {
            "action": "Ignore",
            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
        }
        # A plain deletion does not: gymkube-train says it with its exit code.
        assert deleted == {
            "action": "Ignore",
            "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [75]},
        }
        assert bad_input == {
            "action": "FailJob",
            "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [2]},
        }
        # Any other exit (1, an OOM kill's 137) matches no rule: it counts against backoffLimit.
        assert {r["onExitCodes"]["containerName"] for r in (deleted, bad_input)} <= {
            c["name"] for c in spec["template"]["spec"]["containers"]
        }


def test_trainer_pod_has_shm_data_config_model_and_checkpoints() -> None:
    run = target(shmSize="32Gi", checkpoints={"persistentVolumeClaim": {"claimName": "ckpt"}})
    pod = render.training_job(run)["spec"]["template"]["spec"]
    volumes = by_name(pod["volumes"])
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    assert volumes["agent-loop"]["configMap"]["name"] == "grpo-agent-loop"
    assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"] == "ckpt"
    assert volumes["model"]["persistentVolumeClaim"]["claimName"] == "models"
    mounts = by_name(pod["containers"][0]["volumeMounts"])
    assert mounts["shm"]["mountPath"] == "/dev/shm"
    assert mounts["model"] == {"name": "model", "mountPath": "/models", "readOnly": True}
    assert mounts["agent-loop"]["mountPath"] == "/etc/gymkube"
    assert mounts["checkpoints"]["mountPath"] == "/checkpoints"
    assert mounts["data"]["mountPath"] == "/data"


def test_without_a_checkpoints_volume_the_run_writes_to_an_empty_dir() -> None:
    pod = render.training_job(target())["spec"]["template"]["spec"]
    assert by_name(pod["volumes"])["checkpoints"] == {"name": "checkpoints", "emptyDir": {}}
    assert "TENSORBOARD_DIR" not in by_name(pod["containers"][0]["env"])


def test_verls_tensorboard_log_goes_beside_the_kept_checkpoints() -> None:
    kept = {"checkpoints": {"persistentVolumeClaim": {"claimName": "ckpt"}}}
    job_pod = render.training_job(target(**kept))["spec"]["template"]["spec"]
    ray = render.training_rayjob(target(nodes=2, **kept))["spec"]["rayClusterSpec"]
    ray_pods = [ray["headGroupSpec"], *ray["workerGroupSpecs"]]
    for pod in [job_pod, *(group["template"]["spec"] for group in ray_pods)]:
        (trainer,) = pod["containers"]
        env = by_name(trainer["env"])
        assert env["TENSORBOARD_DIR"]["value"] == "/checkpoints/grpo/tensorboard"
        # The dataset steps log nothing.
        assert all("TENSORBOARD_DIR" not in by_name(c["env"]) for c in pod["initContainers"])


def test_dataset_steps_run_before_training_and_write_the_parquet_verl_reads() -> None:
    pod = render.training_job(target())["spec"]["template"]["spec"]
    init = pod["initContainers"]
    assert [c["name"] for c in init] == ["dataset-train", "dataset-val"]
    outs = [c["command"][c["command"].index("--out") + 1] for c in init]
    assert outs == [command.TRAIN_FILE, command.VAL_FILE]
    for container in init:
        assert container["image"] == "reg/trainer:1"
        assert container["imagePullPolicy"] == "Always"
        assert container["command"][0] == "gymkube-dataset"
        assert [m["mountPath"] for m in container["volumeMounts"]] == ["/data", "/etc/gymkube"]


def test_pod_template_merges_scheduling_and_env_into_the_trainer() -> None:
    run = target(
        podTemplate={
            "nodeSelector": {"gpu": "h100"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "containers": [{"name": "trainer", "env": [{"name": "HF_HOME", "value": "/hf"}]}],
        }
    )
    pod = render.training_job(run)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"gpu": "h100"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    (trainer,) = pod["containers"]
    env = by_name(trainer["env"])
    assert set(env) == {"GYMKUBE_ENV_URL", "SCIWORLD_ENV_BASE", "HF_HOME"}
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == 8


def test_cpu_and_memory_resources_sit_beside_the_gpus() -> None:
    run = target(resources={"requests": {"cpu": "32", "memory": "256Gi"}, "limits": {"cpu": 64}})
    resources = render.training_job(run)["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources == {
        "requests": {"cpu": "32", "memory": "256Gi"},
        "limits": {"cpu": 64, "nvidia.com/gpu": 8},
    }


def test_queue_name_labels_the_child_and_creates_it_suspended() -> None:
    job = render.training_child(target(queueName="gpu-queue"))
    assert job["metadata"]["labels"][render.QUEUE_LABEL] == "gpu-queue"
    assert job["spec"]["suspend"] is True
    rayjob = render.training_child(target(queueName="gpu-queue", nodes=3))
    assert rayjob["metadata"]["labels"][render.QUEUE_LABEL] == "gpu-queue"
    assert rayjob["spec"]["suspend"] is True
    assert render.PRIORITY_LABEL not in job["metadata"]["labels"]


def test_a_workload_priority_class_labels_the_child_for_kueue() -> None:
    for nodes in (1, 3):
        child = render.training_child(
            target(queueName="gpu-queue", workloadPriorityClass="urgent", nodes=nodes)
        )
        assert child["metadata"]["labels"][render.PRIORITY_LABEL] == "urgent"


def test_suspended_run_creates_a_suspended_child() -> None:
    assert render.training_child(target(suspend=True))["spec"]["suspend"] is True


def test_several_nodes_are_a_rayjob_with_a_gpu_head_and_workers() -> None:
    run = target(nodes=4, gpusPerNode=8, backoffLimit=1, activeDeadlineSeconds=3600)
    rayjob = render.training_child(run)
    assert (rayjob["apiVersion"], rayjob["kind"]) == ("ray.io/v1", "RayJob")
    spec = rayjob["spec"]
    assert spec["entrypoint"] == command.ray_entrypoint(run)
    assert "trainer.nnodes=4" in spec["entrypoint"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"]) == (1, 3600)
    cluster = spec["rayClusterSpec"]
    assert cluster["headGroupSpec"]["rayStartParams"] == {"dashboard-host": "0.0.0.0"}
    head = cluster["headGroupSpec"]["template"]["spec"]
    (group,) = cluster["workerGroupSpecs"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 3
    assert group["rayStartParams"] == {}
    worker = group["template"]["spec"]
    for pod, health in ((head, render.RAY_HEAD_HEALTH), (worker, render.RAY_NODE_HEALTH)):
        (container,) = pod["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
        assert "command" not in container  # KubeRay starts Ray itself
        assert "terminationMessagePolicy" not in container
        # Probes of our own: KubeRay's run wget, which the trainer images do not carry.
        assert container["readinessProbe"]["httpGet"] == health
        assert container["livenessProbe"]["httpGet"] == health
        # Ray's workers (verl's driver among them) write the files gymkube-train reads.
        env = {e["name"]: e["value"] for e in container["env"]}
        assert command.RAY_RUN_FILES.items() <= env.items()
        assert [c["name"] for c in pod["initContainers"]] == ["dataset-train", "dataset-val"]
        assert by_name(pod["volumes"])["shm"]["emptyDir"]["medium"] == "Memory"
        assert "restartPolicy" not in pod
    # KubeRay's submitter pod, which follows the trainer's log, is read like a Job's trainer.
    submitter = spec["submitterPodTemplate"]["spec"]
    (container,) = submitter["containers"]
    assert container["name"] == render.TRAINER
    assert container["image"] == head["containers"][0]["image"]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert "command" not in container  # KubeRay's `ray job submit`, then `ray job logs --follow`
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})


def test_a_cpu_rayjob_makes_each_ray_node_one_made_up_gpu() -> None:
    """On CPU KubeRay starts Ray on every node with the made-up GPU verl's pools need; verl only
    connects, so the one-node ray.init settings are left out (Ray refuses them on connect)."""
    run = target(nodes=2, device="cpu")
    spec = render.training_child(run)["spec"]
    cluster = spec["rayClusterSpec"]
    made_up = {"num-gpus": "1", "num-cpus": str(device.LOGICAL_CPUS)}
    assert cluster["headGroupSpec"]["rayStartParams"] == {"dashboard-host": "0.0.0.0", **made_up}
    assert cluster["workerGroupSpecs"][0]["rayStartParams"] == made_up
    entrypoint = shlex.split(spec["entrypoint"])
    assert "trainer.nnodes=2" in entrypoint
    assert "trainer.n_gpus_per_node=1" in entrypoint
    assert not any("ray_kwargs.ray_init" in arg for arg in entrypoint)
    for group in (cluster["headGroupSpec"], cluster["workerGroupSpecs"][0]):
        (container,) = group["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert device.CPU_ENV.items() <= env.items()
        assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    one_node = shlex.split(command.ray_entrypoint(target(device="cpu")))
    assert [a for a in one_node if a not in entrypoint] == [
        "trainer.nnodes=1",
        *device.ONE_NODE_CPU_OVERRIDES,
    ]


def test_config_map_holds_the_agent_loop_yaml_and_the_run_settings() -> None:
    cm = render.config_map(target())
    assert cm["metadata"]["name"] == "grpo-agent-loop"
    assert cm["metadata"]["ownerReferences"][0]["name"] == "grpo"
    assert set(cm["data"]) == {command.AGENT_LOOP_FILE, command.SETTINGS_FILE}
    assert POOL_URL in cm["data"][command.AGENT_LOOP_FILE]


def test_preflight_is_a_cpu_only_restricted_job_reporting_through_its_termination_message() -> None:
    job = render.preflight_job(target(preflight={"episodes": 3, "activeDeadlineSeconds": 120}))
    assert job["metadata"]["name"] == "grpo-preflight"
    assert render.QUEUE_LABEL not in job["metadata"]["labels"]
    spec = job["spec"]
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"]) == (0, 120)
    pod = spec["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["image"] == "reg/preflight:1"
    assert container["imagePullPolicy"] == "Always"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert "--episodes" in container["command"]
    assert container["command"][container["command"].index("--episodes") + 1] == "3"


def test_a_preflight_mounts_the_runs_config_map_only_for_its_own_templates() -> None:
    def preflight_pod(run: RunTarget) -> dict[str, Any]:
        pod: dict[str, Any] = render.preflight_job(run)["spec"]["template"]["spec"]
        return pod

    plain = preflight_pod(target())
    assert [v["name"] for v in plain["volumes"]] == ["tmp"]
    templates = {"guess": {"system": "s"}}
    own = preflight_pod(target(agentLoop={"templates": templates}))
    volumes = by_name(own["volumes"])
    assert volumes["agent-loop"]["configMap"] == {"name": render.config_map_name("grpo")}
    mounts = by_name(own["containers"][0]["volumeMounts"])
    assert mounts["agent-loop"]["mountPath"] == command.CONFIG_DIR
    assert f"{command.CONFIG_DIR}/{command.TEMPLATES_FILE}" in own["containers"][0]["command"]


def trainer_of(job: dict[str, Any]) -> dict[str, Any]:
    (trainer,) = job["spec"]["template"]["spec"]["containers"]
    return dict(trainer)


def test_cpu_and_gpu_renderings_of_one_spec_differ_by_the_device_settings_alone() -> None:
    """The same spec on both devices: the CPU Job is the GPU Job with the device's environment
    in the trainer container, its overrides in verl's command (one replacing gpusPerNode's), and
    no GPU limit. Nothing else differs: not the dataset steps, volumes or anything in the pod."""
    same = {"gpusPerNode": 8, "resources": {"limits": {"memory": "14Gi"}}, "overrides": ["x.y=1"]}
    gpu = render.training_job(target(**same))
    cpu = render.training_job(target(**same, device="cpu"))
    gpu_trainer, cpu_trainer = trainer_of(gpu), trainer_of(cpu)

    assert cpu_trainer["env"] == gpu_trainer["env"] + [
        {"name": name, "value": value} for name, value in device.CPU_ENV.items()
    ]
    assert "CUDA_VISIBLE_DEVICES" not in device.CPU_ENV
    assert gpu_trainer["resources"]["limits"] == {"memory": "14Gi", "nvidia.com/gpu": 8}
    assert cpu_trainer["resources"]["limits"] == {"memory": "14Gi"}

    gpu_command, cpu_command = gpu_trainer["command"], cpu_trainer["command"]
    cpu_overrides = [*device.CPU_OVERRIDES, *device.ONE_NODE_CPU_OVERRIDES]
    assert [a for a in cpu_command if a not in gpu_command] == cpu_overrides
    assert [a for a in gpu_command if a not in cpu_command] == ["trainer.n_gpus_per_node=8"]
    # The device's settings come after gymkube's own and before the user's, which still win.
    assert cpu_command[-1 - len(cpu_overrides) : -1] == cpu_overrides
    assert cpu_command[-1] == "x.y=1"

    def rest(job: dict[str, Any]) -> dict[str, Any]:
        other = copy.deepcopy(job)
        for key in ("env", "command", "resources"):
            del other["spec"]["template"]["spec"]["containers"][0][key]
        return other

    assert rest(cpu) == rest(gpu)


CUSTOM_LOOP = {"className": "my_loops.SciWorldLoop", "configMap": "my-loops"}


def test_a_custom_loop_is_the_agent_loop_yamls_one_entry_with_its_own_parameters() -> None:
    parameters = {"max_rounds": 30, "name": "mine", "_target_": "other.Loop"}
    run = target(customAgentLoop={**CUSTOM_LOOP, "parameters": parameters})
    assert command.agent_loop_config(run) == [
        {"max_rounds": 30, "name": command.AGENT_LOOP_NAME, "_target_": "my_loops.SciWorldLoop"}
    ]
    # Rows still name the one loop verl is told to default to.
    assert f"actor_rollout_ref.rollout.agent.default_agent_loop={command.AGENT_LOOP_NAME}" in (
        command.verl_overrides(run)
    )


def test_gymkube_train_imports_and_checks_a_custom_loop_before_verl_starts() -> None:
    wrapper = command.trainer_command(target(customAgentLoop=CUSTOM_LOOP))
    cut = wrapper.index("--")
    assert wrapper[wrapper.index("--agent-loop-class") + 1] == "my_loops.SciWorldLoop"
    assert wrapper.index("--agent-loop-class") < cut
    assert "--agent-loop-class" not in command.trainer_command(target())


@pytest.mark.parametrize("nodes", [1, 2], ids=["job", "rayjob"])
def test_a_custom_loops_code_is_mounted_on_pythonpath_in_every_trainer_pod(nodes: int) -> None:
    child = render.training_child(target(nodes=nodes, customAgentLoop=CUSTOM_LOOP))
    if nodes == 1:
        pods = [child["spec"]["template"]["spec"]]
    else:
        cluster = child["spec"]["rayClusterSpec"]
        pods = [cluster["headGroupSpec"]["template"]["spec"]]
        pods += [group["template"]["spec"] for group in cluster["workerGroupSpecs"]]
    for pod in pods:
        volume = by_name(pod["volumes"])[render.CUSTOM_LOOP_VOLUME]
        assert volume["configMap"] == {"name": "my-loops"}
        (trainer,) = pod["containers"]
        mount = by_name(trainer["volumeMounts"])[render.CUSTOM_LOOP_VOLUME]
        assert (mount["mountPath"], mount["readOnly"]) == (command.CUSTOM_LOOP_DIR, True)
        assert {"name": "PYTHONPATH", "value": command.CUSTOM_LOOP_DIR} in trainer["env"]


def test_every_trainer_container_reads_the_pool_url_under_both_conventions() -> None:
    job = render.training_child(target())
    pod = job["spec"]["template"]["spec"]
    for container in [*pod["initContainers"], *pod["containers"]]:
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["GYMKUBE_ENV_URL"] == env["SCIWORLD_ENV_BASE"] == POOL_URL
    assert "PYTHONPATH" not in {e["name"] for e in pod["containers"][0]["env"]}


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ("sciworld", "SCIWORLD_ENV_BASE"),
        ("frozen_lake", "FROZEN_LAKE_ENV_BASE"),
        ("my-env", "MY_ENV_ENV_BASE"),
    ],
)
def test_the_env_base_variable_is_the_env_name_in_upper_case(env: str, variable: str) -> None:
    assert command.env_base_var(env) == variable
