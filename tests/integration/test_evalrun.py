"""The EvalRun operator against a real API server and controller manager.

No kubelet runs here, so the tests do what one would: they report the pods the Job controller
creates as ready and finished, with gymkube-eval's termination message. Everything else is real:
the gymkube-operator process, the EnvPool handlers making the pool Ready, the CRD's schema and CEL
rules, the Job controller turning pod results into Job conditions.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from controlplane import ControlPlane
from gymkube_operator.evalrun import command, render
from gymkube_operator.evalrun.command import EvalTarget
from gymkube_operator.evalrun.models import EvalRunSpec
from gymkube_operator.evalrun.reasons import Reason
from gymkube_operator.trainingrun import command as training
from gymkube_operator.trainingrun.command import Run
from gymkube_operator.trainingrun.resource import TRAININGRUN
from operator_support import Cluster, OperatorProcess, envpool, eventually, install_crds

pytestmark = pytest.mark.integration

GROUP, VERSION, PLURAL = "gymkube.io", "v1alpha1", "evalruns"
POOL = "lake"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "evalrun-frozenlake-base.yaml"
CHECKPOINTS = {"persistentVolumeClaim": {"claimName": "checkpoints"}}
RESULT = {
    "model": "/models/base",
    "checkpointStep": None,
    "episodes": 8,
    "successes": 2,
    "successRate": 0.25,
    "successRateInterval": [0.07, 0.59],
    "meanScore": 0.25,
    "meanScoreInterval": [0.0, 0.55],
    "meanTurns": 3.0,
    "envErrors": 0,
}


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Evals:
    """Reads and writes on EvalRuns, TrainingRuns and Jobs in one namespace."""

    def __init__(self, kube: ControlPlane, client: kubernetes.client.ApiClient, ns: str) -> None:
        self.kube = kube
        self.namespace = ns
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.batch = kubernetes.client.BatchV1Api(client)
        self.core = kubernetes.client.CoreV1Api(client)
        self.cluster = Cluster(client, ns)

    def create(self, name: str, **spec: Any) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "EvalRun",
            "metadata": {"name": name},
            "spec": {"envPoolRef": {"name": POOL}, "model": {"path": "/models/base"}, **spec},
        }
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)

    def create_training_run(self, name: str, **spec: Any) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TrainingRun",
            "metadata": {"name": name},
            # Suspended: the TrainingRun handlers leave it be.
            "spec": {
                "envPoolRef": {"name": POOL},
                "model": {"path": "/models/base"},
                "suspend": True,
                **spec,
            },
        }
        self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, TRAININGRUN.plural, body
        )

    def get(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name
        )
        return found

    def wait_condition(
        self, name: str, type_: str, status: str, reason: str | None = None, timeout: float = 30
    ) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            evaluation = self.get(name)
            for found in (evaluation.get("status") or {}).get("conditions", []):
                if found["type"] == type_ and found["status"] == status:
                    return evaluation if reason in (None, found["reason"]) else None
            return None

        return eventually(f"{name}: {type_}={status} ({reason})", probe, timeout)

    def condition(self, evaluation: dict[str, Any], type_: str) -> dict[str, Any]:
        (found,) = [c for c in evaluation["status"]["conditions"] if c["type"] == type_]
        return dict(found)

    def jobs(self) -> list[str]:
        return [j.metadata.name for j in self.batch.list_namespaced_job(self.namespace).items]

    def job(self, name: str) -> Any:
        return eventually(
            f"Job {name}",
            lambda: next(
                (
                    j
                    for j in self.batch.list_namespaced_job(self.namespace).items
                    if j.metadata.name == name
                ),
                None,
            ),
        )

    def job_pod(self, job: str) -> Any:
        def probe() -> Any:
            pods = self.core.list_namespaced_pod(
                self.namespace, label_selector=f"batch.kubernetes.io/job-name={job}"
            ).items
            return pods[0] if pods else None

        return eventually(f"a pod of Job {job} (from the Job controller)", probe)

    def report_pod(self, job: str, exit_code: int | None, message: str = "") -> None:
        """What a kubelet reports: the eval container running and ready, or exited."""
        pod = self.job_pod(job)
        container = pod.spec.containers[0]
        if exit_code is None:
            state: dict[str, Any] = {"running": {"startedAt": now()}}
            ready = [
                {"type": t, "status": "True", "lastTransitionTime": now()}
                for t in ("Ready", "ContainersReady")
            ]
            phase = "Running"
        else:
            terminated = {
                "exitCode": exit_code,
                "reason": "Completed" if exit_code == 0 else "Error",
                "startedAt": now(),
                "finishedAt": now(),
                **({"message": message} if message else {}),
            }
            state, ready = {"terminated": terminated}, []
            phase = "Succeeded" if exit_code == 0 else "Failed"
        status = {
            "phase": phase,
            "conditions": ready,
            "containerStatuses": [
                {
                    "name": container.name,
                    "image": container.image,
                    "imageID": "",
                    "ready": exit_code is None,
                    "restartCount": 0,
                    "state": state,
                }
            ],
        }
        self.core.patch_namespaced_pod_status(pod.metadata.name, self.namespace, {"status": status})

    def dry_run(self, name: str, spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        """A server-side dry run of a minimal EvalRun with `spec` merged in (None drops a key)."""
        body: dict[str, Any] = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "EvalRun",
            "metadata": {"name": name},
            "spec": {"envPoolRef": {"name": POOL}, "model": {"path": "/models/base"}},
        }
        for key, value in spec.items():
            if value is None:
                del body["spec"][key]
            else:
                body["spec"][key] = value
        return self.kube.kubectl(
            "apply",
            "--dry-run=server",
            "-n",
            self.namespace,
            "-f",
            "-",
            input=json.dumps(body),
            check=False,
        )


@pytest.fixture(scope="module")
def evals(kube: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Evals]:
    """One namespace and one operator for the module; the pool starts missing."""
    install_crds(kube)
    namespace = f"evalrun-{secrets.token_hex(3)}"
    log = tmp_path_factory.mktemp("evalrun") / "operator.log"
    with kube.api_client() as client:
        core = kubernetes.client.CoreV1Api(client)
        core.create_namespace({"metadata": {"name": namespace}})
        eventually(
            "the namespace's default service account",
            lambda: (
                core.list_namespaced_service_account(
                    namespace, field_selector="metadata.name=default"
                ).items
                or None
            ),
        )
        with pytest.MonkeyPatch.context() as env:
            env.setenv("GYMKUBE_TRAININGRUN_RESYNC_SECONDS", "1")
            env.setenv("GYMKUBE_TRAINER_IMAGE", "reg.example/trainer:1")
            env.setenv("GYMKUBE_CPU_TRAINER_IMAGE", "reg.example/trainer-cpu:1")
            operator = OperatorProcess(kube, namespace, log)
        evals = Evals(kube, client, namespace)
        try:
            yield evals
            for plural in (PLURAL, TRAININGRUN.plural, "envpools"):
                for item in evals.custom.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, plural
                )["items"]:
                    evals.custom.delete_namespaced_custom_object(
                        GROUP, VERSION, namespace, plural, item["metadata"]["name"]
                    )
            eventually(
                "evals, runs and pools deleted (finalizers released)",
                lambda: (
                    all(
                        not evals.custom.list_namespaced_custom_object(
                            GROUP, VERSION, namespace, p
                        )["items"]
                        for p in (PLURAL, TRAININGRUN.plural, "envpools")
                    )
                    or None
                ),
            )
        finally:
            operator.stop()
            print(f"--- operator log ({log}) ---\n{operator.log_tail()}")
            core.delete_namespace(namespace)


def make_pool_ready(evals: Evals) -> str:
    """The EnvPool handlers make the pool; the test plays kubelet for its pods."""
    cluster = evals.cluster
    if cluster.get(POOL) is None:
        cluster.create(envpool(POOL, replicas=1))

    def marked() -> bool | None:
        return True if cluster.mark_pods_ready(f"gymkube.io/envpool={POOL}") == 2 else None

    eventually("pool pods from the StatefulSet and Deployment controllers", marked)
    evals.kube.kubectl(
        "wait", "-n", evals.namespace, "--for=condition=Ready", f"envpool/{POOL}", "--timeout=60s"
    )
    url: str = (cluster.get(POOL) or {})["status"]["url"]
    return url


INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("no model", {"model": None}, "spec.model: Required value"),
    ("no pool", {"envPoolRef": None}, "spec.envPoolRef: Required value"),
    (
        "path and trainingRun",
        {"model": {"path": "/models/base", "trainingRun": {"name": "grpo"}}},
        "model names exactly one of path and trainingRun",
    ),
    ("neither", {"model": {"mountPath": "/models"}}, "model names exactly one of path and"),
    (
        "volume with trainingRun",
        {"model": {"trainingRun": {"name": "grpo"}, "volume": {"emptyDir": {}}}},
        "model.volume goes with model.path",
    ),
    (
        "model outside its volume",
        {"model": {"path": "/data/q", "volume": {"persistentVolumeClaim": {"claimName": "m"}}}},
        "model.path must lie under model.mountPath when model.volume is set",
    ),
    (
        "step newest",
        {"model": {"trainingRun": {"name": "grpo", "step": "newest"}}},
        "step is latest or a step number of 1 or more",
    ),
    (
        "step zero",
        {"model": {"trainingRun": {"name": "grpo", "step": 0}}},
        "step is latest or a step number of 1 or more",
    ),
    ("unknown split", {"dataset": {"split": "validation"}}, "spec.dataset.split: Unsupported"),
    ("no tasks", {"dataset": {"size": 0}}, "spec.dataset.size: Invalid value: 0"),
    ("top-p zero", {"sampling": {"topP": 0}}, "spec.sampling.topP"),
    ("negative temperature", {"sampling": {"temperature": -1}}, "spec.sampling.temperature"),
    ("unknown device", {"device": "tpu"}, 'spec.device: Unsupported value: "tpu"'),
    ("unknown reward", {"agentLoop": {"reward": "max"}}, "spec.agentLoop.reward: Unsupported"),
    ("negative TTL", {"ttlSecondsAfterFinished": -1}, "spec.ttlSecondsAfterFinished"),
]


@pytest.mark.parametrize(("case", "spec", "message"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_evals_are_rejected_with_a_readable_message(
    evals: Evals, case: str, spec: dict[str, Any], message: str
) -> None:
    result = evals.dry_run("invalid", spec)
    assert result.returncode != 0, case
    assert message in result.stderr


def test_long_names_are_rejected(evals: Evals) -> None:
    result = evals.dry_run("a" * 41, {})
    assert "EvalRun names are at most 40 characters" in result.stderr


@pytest.mark.parametrize("step", ["latest", 3], ids=["latest", "a step number"])
def test_a_checkpoint_step_is_accepted_as_latest_or_a_number(evals: Evals, step: Any) -> None:
    result = evals.dry_run("steps", {"model": {"trainingRun": {"name": "grpo", "step": step}}})
    assert result.returncode == 0, result.stderr


def test_the_examples_children_are_valid_kubernetes_objects(evals: Evals) -> None:
    """The ConfigMap and Job rendered from the example pass the API server's own validation
    (volumes, resources, the pod failure policy), checked by a server-side dry run."""
    (doc,) = yaml.safe_load_all(EXAMPLE.read_text())
    target = EvalTarget(
        run=Run(
            name=doc["metadata"]["name"],
            namespace=evals.namespace,
            uid="6b1a0c0e-0000-4000-8000-000000000000",
            trainer_image="reg.example/trainer:1",
            cpu_trainer_image="reg.example/trainer-cpu:1",
            preflight_image="reg.example/preflight:1",
            image_pull_policy="IfNotPresent",
        ),
        spec=EvalRunSpec.model_validate(doc["spec"]),
        pool_url=f"http://frozen-lake-easy.{evals.namespace}.svc:8000",
        env="frozen_lake",
    )
    children = [render.config_map(target), render.eval_job(target)]
    result = evals.kube.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": children}),
    )
    assert result.stdout.count("serverside-applied (server dry run)") == 2


def test_a_valid_eval_gets_its_job_once_the_pool_is_ready_and_keeps_its_score(
    evals: Evals,
) -> None:
    evals.create("base", dataset={"size": 8})
    waiting = evals.wait_condition("base", "EnvPoolReady", "False", "EnvPoolNotFound")
    assert waiting["status"]["phase"] == "WaitingForEnvPool"
    assert render.job_name("base") not in evals.jobs()

    url = make_pool_ready(evals)
    evals.wait_condition("base", "EnvPoolReady", "True")
    job = evals.job(render.job_name("base"))
    pod = job.spec.template.spec
    (init,) = pod.init_containers
    assert init.command[:2] == ["gymkube-dataset", "--env-url"]
    assert init.command[init.command.index("--size") + 1] == "8"
    (container,) = pod.containers
    assert container.command[0] == command.EVAL_RUNNER
    assert container.command[container.command.index("--env-url") + 1] == url
    assert container.image == "reg.example/trainer:1"
    assert container.resources.limits == {"nvidia.com/gpu": "1"}
    config_map = evals.core.read_namespaced_config_map(
        render.config_map_name("base"), evals.namespace
    )
    assert training.AGENT_LOOP_FILE in config_map.data
    assert [(o.kind, o.name) for o in job.metadata.owner_references] == [("EvalRun", "base")]

    evals.report_pod(job.metadata.name, exit_code=None)
    evals.wait_condition("base", "Running", "True", Reason.EVAL_RUNNING)
    evals.report_pod(job.metadata.name, exit_code=0, message=json.dumps(RESULT))
    done = evals.wait_condition("base", "Succeeded", "True", Reason.EVAL_SUCCEEDED, timeout=60)
    status = done["status"]
    # A path model has no checkpoint step: null in the summary, left out of the status.
    assert status["result"] == {k: v for k, v in RESULT.items() if v is not None}
    assert status["progress"]["episodes"] == 8
    assert status["progress"]["meanScore"] == 0.25
    assert status["phase"] == "Succeeded"
    assert status["completionTime"]
    assert "mean score 0.250" in evals.condition(done, "Succeeded")["message"]
    listed = evals.kube.kubectl("get", "evr", "-n", evals.namespace, "base").stdout
    assert "/models/base" in listed
    assert "0.25" in listed


def test_a_trainingrun_model_without_a_checkpoints_volume_fails_with_the_message(
    evals: Evals,
) -> None:
    evals.create_training_run("no-volume")
    evals.create("of-no-volume", model={"trainingRun": {"name": "no-volume"}})
    failed = evals.wait_condition("of-no-volume", "Failed", "True", Reason.NO_CHECKPOINTS_VOLUME)
    message = evals.condition(failed, "Failed")["message"]
    assert "TrainingRun no-volume has no spec.checkpoints volume" in message
    assert "died with its pod" in message
    evals.create("of-nothing", model={"trainingRun": {"name": "never-made"}})
    missing = evals.wait_condition("of-nothing", "Failed", "True", Reason.TRAINING_RUN_NOT_FOUND)
    assert "TrainingRun never-made does not exist" in evals.condition(missing, "Failed")["message"]
    time.sleep(2)  # a few reconciles later, still nothing made
    jobs = evals.jobs()
    assert render.job_name("of-no-volume") not in jobs
    assert render.job_name("of-nothing") not in jobs


def test_a_checkpoint_is_read_from_the_trainingruns_volume_and_a_missing_step_fails(
    evals: Evals,
) -> None:
    make_pool_ready(evals)
    agent_loop = {"maxTurns": 3, "maxResponseTokens": 512}
    evals.create_training_run("grpo", checkpoints=CHECKPOINTS, device="cpu", agentLoop=agent_loop)
    evals.create("of-grpo", model={"trainingRun": {"name": "grpo", "step": 7}})
    job = evals.job(render.job_name("of-grpo"))
    pod = job.spec.template.spec
    volumes = {v.name: v for v in pod.volumes}
    assert volumes["checkpoints"].persistent_volume_claim.claim_name == "checkpoints"
    (container,) = pod.containers
    mounts = {m.name: m for m in container.volume_mounts}
    assert (mounts["checkpoints"].mount_path, mounts["checkpoints"].read_only) == (
        training.CHECKPOINTS_DIR,
        True,
    )
    argv = container.command
    assert argv[argv.index("--checkpoints") + 1] == training.checkpoint_dir("grpo")
    assert argv[argv.index("--step") + 1] == "7"
    # The TrainingRun's device and agent loop: eval plays as training did.
    assert argv[argv.index("--device") + 1] == "cpu"
    assert argv[argv.index("--max-response-tokens") + 1] == "512"
    assert container.image == "reg.example/trainer-cpu:1"

    said = "TrainingRun checkpoint step 7 not found under /checkpoints/grpo (saved steps: 1, 2, 3)"
    evals.report_pod(job.metadata.name, exit_code=command.EVAL_EXIT_BAD_INPUT, message=said)
    failed = evals.wait_condition("of-grpo", "Failed", "True", Reason.INVALID_MODEL, timeout=60)
    assert evals.condition(failed, "Failed")["message"] == said
