"""The TrainingRun operator against a real API server and controller manager.

No kubelet runs here, so the tests do what one would: they report the pods the Job controller
creates as ready, succeeded (with the preflight's termination message) or failed. Everything else
is real: the gymkube-operator process, the EnvPool handlers making the pool Ready, the Job
controller turning pod results into Job conditions, and garbage collection.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from controlplane import ControlPlane
from gymkube_operator.crds.catalog import package_file
from gymkube_operator.trainingrun import render
from gymkube_operator.trainingrun.command import Run, RunTarget, ServedPool
from gymkube_operator.trainingrun.models import HISTORY_STEPS, TrainingRunSpec
from gymkube_operator.trainingrun.resource import TRAININGRUN
from operator_support import (
    Cluster,
    OperatorProcess,
    envpool,
    eventually,
    install_crds,
)

pytestmark = pytest.mark.integration

GROUP, VERSION, PLURAL = "gymkube.io", "v1alpha1", "trainingruns"
POOL = "lake"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SUMMARY = {"ok": True, "episodes": 8, "env_errors": {}, "mean_score": 0.25}

# Just enough of KubeRay's CRD for the API server to serve ray.io/v1 RayJob.
RAYJOB_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "rayjobs.ray.io"},
    "spec": {
        "group": "ray.io",
        "scope": "Namespaced",
        "names": {"kind": "RayJob", "plural": "rayjobs", "singular": "rayjob"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
                "subresources": {"status": {}},
            }
        ],
    },
}


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Runs:
    """Reads and writes on TrainingRuns and their children in one namespace."""

    operator: OperatorProcess
    start_operator: Callable[[], OperatorProcess]

    def __init__(self, client: kubernetes.client.ApiClient, namespace: str) -> None:
        self.namespace = namespace
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.batch = kubernetes.client.BatchV1Api(client)
        self.core = kubernetes.client.CoreV1Api(client)
        self.api = client

    def create(self, name: str, **spec: Any) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TrainingRun",
            "metadata": {"name": name},
            "spec": {"envPoolRef": {"name": POOL}, "model": {"path": "/models/q"}, **spec},
        }
        # A None drops the key (envPoolRef, for a run over envPools).
        body["spec"] = {key: value for key, value in body["spec"].items() if value is not None}
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            run: dict[str, Any] = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name
            )
        except kubernetes.client.ApiException as error:
            if error.status == 404:
                return None
            raise
        return run

    def patch(self, name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, {"spec": spec}
        )

    def condition(self, name: str, type_: str) -> dict[str, Any]:
        run = self.get(name) or {}
        for found in run.get("status", {}).get("conditions", []):
            if found["type"] == type_:
                return dict(found)
        return {}

    def wait_condition(
        self, name: str, type_: str, status: str, reason: str | None = None, timeout: float = 30
    ) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            found = self.condition(name, type_)
            if found.get("status") == status and reason in (None, found.get("reason")):
                return found
            return None

        return eventually(f"{name}: {type_}={status} ({reason})", probe, timeout)

    def wait_phase(self, name: str, phase: str, timeout: float = 30) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            run = self.get(name) or {}
            return run if run.get("status", {}).get("phase") == phase else None

        return eventually(f"{name} in phase {phase}", probe, timeout)

    def job(self, name: str) -> Any:
        try:
            return self.batch.read_namespaced_job(name, self.namespace)
        except kubernetes.client.ApiException as error:
            if error.status == 404:
                return None
            raise

    def children(self, run: str) -> set[tuple[str, str]]:
        selector = f"gymkube.io/trainingrun={run}"
        found = {
            ("Job", j.metadata.name)
            for j in self.batch.list_namespaced_job(self.namespace, label_selector=selector).items
        }
        found |= {
            ("ConfigMap", c.metadata.name)
            for c in self.core.list_namespaced_config_map(
                self.namespace, label_selector=selector
            ).items
        }
        return found

    def job_pods(self, job: str) -> list[Any]:
        pods: list[Any] = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"batch.kubernetes.io/job-name={job}"
        ).items
        return pods

    def job_pod(self, job: str) -> Any:
        """The Job's pod that has not stopped (a Job replaces a pod once it stopped), else any."""

        def probe() -> Any:
            pods = self.job_pods(job)
            running = [p for p in pods if p.status.phase not in ("Succeeded", "Failed")]
            return (running or pods or [None])[0]

        return eventually(f"a pod of Job {job} (from the Job controller)", probe)

    def finish_pod(
        self,
        job: str,
        exit_code: int,
        message: str = "",
        reason: str | None = None,
        disruption: tuple[str, str] | None = None,
    ) -> str:
        """What a kubelet reports when the pod's container exits (after the component named in
        `disruption`, (reason, message), marked it DisruptionTarget); the pod's name."""
        pod = self.job_pod(job)
        container = pod.spec.containers[0]
        terminated = {
            "exitCode": exit_code,
            "reason": reason or ("Completed" if exit_code == 0 else "Error"),
            "startedAt": now(),
            "finishedAt": now(),
            **({"message": message} if message else {}),
        }
        status = {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "containerStatuses": [
                {
                    "name": container.name,
                    "image": container.image,
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": terminated},
                }
            ],
        }
        if disruption is not None:
            cause, said = disruption
            target = {"type": "DisruptionTarget", "status": "True", "reason": cause}
            status["conditions"] = [target | {"message": said, "lastTransitionTime": now()}]
        self.core.patch_namespaced_pod_status(pod.metadata.name, self.namespace, {"status": status})
        name: str = pod.metadata.name
        return name

    def ready_pod(self, job: str) -> None:
        pod = self.job_pod(job)
        status = {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": now()},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": now()},
            ],
        }
        self.core.patch_namespaced_pod_status(pod.metadata.name, self.namespace, {"status": status})

    def events(self, run: str) -> dict[str, str]:
        """The run's Events: reason -> message."""
        events = self.core.list_namespaced_event(
            self.namespace,
            field_selector=f"involvedObject.name={run},involvedObject.kind=TrainingRun",
        ).items
        return {e.reason: e.message for e in events}

    def event_reasons(self, run: str) -> set[str]:
        return set(self.events(run))

    def wait_events(self, run: str, reasons: set[str]) -> None:
        """Wait until the run has an Event for every one of reasons (Events are written after
        the status they announce, so a reader can see the condition first)."""
        eventually(
            f"events {sorted(reasons)} on {run}",
            lambda: reasons <= self.event_reasons(run) or None,
        )


def start_operator(kube: ControlPlane, namespace: str, log: Path) -> OperatorProcess:
    """gymkube-operator watching the namespace, resyncing every second, with test images."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("GYMKUBE_TRAININGRUN_RESYNC_SECONDS", "1")
        env.setenv("GYMKUBE_TRAINER_IMAGE", "reg.example/trainer:1")
        env.setenv("GYMKUBE_CPU_TRAINER_IMAGE", "reg.example/trainer-cpu:1")
        env.setenv("GYMKUBE_PREFLIGHT_IMAGE", "reg.example/preflight:1")
        return OperatorProcess(kube, namespace, log)


@pytest.fixture(scope="module")
def crds(kube: ControlPlane) -> None:
    install_crds(kube)
    kube.kubectl("apply", "--server-side", "-f", str(package_file(TRAININGRUN)))
    kube.kubectl("wait", "--for=condition=Established", f"crd/{TRAININGRUN.name}", "--timeout=60s")


@pytest.fixture(scope="module")
def runs(
    kube: ControlPlane, crds: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Runs]:
    """One namespace, one operator and one EnvPool for the whole module (the pool starts
    missing; the first test makes it Ready)."""
    namespace = f"trainingrun-{secrets.token_hex(3)}"
    log = tmp_path_factory.mktemp("trainingrun") / "operator.log"
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
        runs = Runs(client, namespace)
        runs.start_operator = lambda: start_operator(kube, namespace, log)
        runs.operator = runs.start_operator()
        try:
            yield runs
            for plural in (PLURAL, "envpools"):
                for item in runs.custom.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, plural
                )["items"]:
                    runs.custom.delete_namespaced_custom_object(
                        GROUP, VERSION, namespace, plural, item["metadata"]["name"]
                    )
            eventually(
                "runs and pools deleted (finalizers released)",
                lambda: (
                    all(
                        not runs.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, p)[
                            "items"
                        ]
                        for p in (PLURAL, "envpools")
                    )
                    or None
                ),
            )
        finally:
            runs.operator.stop()
            print(f"--- operator log ({log}) ---\n{runs.operator.log_tail()}")
            core.delete_namespace(namespace)


def make_pool_ready(kube: ControlPlane, runs: Runs, name: str = POOL, **spec: Any) -> str:
    """The EnvPool handlers make the pool; the test plays kubelet for its pods."""
    cluster = Cluster(runs.api, runs.namespace)
    if cluster.get(name) is None:
        cluster.create(envpool(name, replicas=1, **spec))

    def marked() -> bool | None:
        return True if cluster.mark_pods_ready(f"gymkube.io/envpool={name}") == 2 else None

    eventually("pool pods from the StatefulSet and Deployment controllers", marked)
    kube.kubectl(
        "wait", "-n", runs.namespace, "--for=condition=Ready", f"envpool/{name}", "--timeout=60s"
    )
    pool = cluster.get(name) or {}
    url: str = pool["status"]["url"]
    return url


INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("no pool", {"envPoolRef": None}, "set envPoolRef (one pool) or envPools (several), not both"),
    (
        "two kinds of pool",
        {"envPools": [{"name": "other"}]},
        "set envPoolRef (one pool) or envPools (several), not both",
    ),
    (
        "a pool twice",
        {"envPoolRef": None, "envPools": [{"name": "a"}, {"name": "a", "weight": 2}]},
        "envPools names each pool once",
    ),
    ("no model", {"model": None}, "spec.model: Required value"),
    ("zero nodes", {"nodes": 0}, "spec.nodes: Invalid value: 0"),
    ("unknown algorithm", {"algorithm": "dpo"}, 'spec.algorithm: Unsupported value: "dpo"'),
    (
        "model outside its volume",
        {"model": {"path": "/data/q", "volume": {"persistentVolumeClaim": {"claimName": "m"}}}},
        "model.path must lie under model.mountPath when model.volume is set",
    ),
    ("not an override", {"overrides": ["--trainer.total_epochs 3"]}, "spec.overrides[0]"),
    ("unknown reward", {"agentLoop": {"reward": "max"}}, "spec.agentLoop.reward: Unsupported"),
    ("unknown split", {"dataset": {"split": "validation"}}, "spec.dataset.split: Unsupported"),
    (
        "template not an object",
        {"agentLoop": {"templates": {"x": "t"}}},
        "spec.agentLoop.templates.x",
    ),
    ("negative TTL", {"ttlSecondsAfterFinished": -1}, "spec.ttlSecondsAfterFinished"),
    ("unknown device", {"device": "tpu"}, 'spec.device: Unsupported value: "tpu"'),
    (
        "waiting forever",
        {"envPoolTimeoutSeconds": 0},
        "spec.envPoolTimeoutSeconds: Invalid value: 0",
    ),
    ("waiting a month", {"envPoolTimeoutSeconds": 2592000}, "spec.envPoolTimeoutSeconds"),
    (
        "custom loop not a class",
        {"customAgentLoop": {"className": "my_loop"}},
        "spec.customAgentLoop.className: Invalid value",
    ),
]


def _dry_run_apply(
    kube: ControlPlane, runs: Runs, name: str, spec: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    """A server-side dry run of a minimal TrainingRun with `spec` merged in (None drops a key)."""
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingRun",
        "metadata": {"name": name},
        "spec": {"envPoolRef": {"name": POOL}, "model": {"path": "/models/q"}},
    }
    for key, value in spec.items():
        if value is None:
            del body["spec"][key]
        else:
            body["spec"][key] = value
    return kube.kubectl(
        "apply",
        "--dry-run=server",
        "-n",
        runs.namespace,
        "-f",
        "-",
        input=json.dumps(body),
        check=False,
    )


@pytest.mark.parametrize(("case", "spec", "message"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_runs_are_rejected_with_a_readable_message(
    kube: ControlPlane, runs: Runs, case: str, spec: dict[str, Any], message: str
) -> None:
    result = _dry_run_apply(kube, runs, "invalid", spec)
    assert result.returncode != 0, case
    assert message in result.stderr


@pytest.mark.parametrize(
    "example", sorted(EXAMPLES.rglob("*.yaml")), ids=lambda p: str(p.relative_to(EXAMPLES))
)
def test_every_example_applies_as_is(kube: ControlPlane, runs: Runs, example: Path) -> None:
    docs = [d for d in yaml.safe_load_all(example.read_text()) if d]
    result = kube.kubectl("apply", "--dry-run=server", "-n", runs.namespace, "-f", str(example))
    lines = result.stdout.splitlines()
    assert len(lines) == len(docs)
    for doc, line in zip(docs, lines, strict=True):
        assert line.endswith(f"/{doc['metadata']['name']} created (server dry run)"), line


@pytest.mark.parametrize(
    ("example", "own_templates"),
    [
        ("trainingrun-sciworld-grpo.yaml", False),
        ("trainingrun-sciworld-grpo.yaml", True),
        ("trainingrun-frozenlake-cpu.yaml", False),
        ("mixed-pools/trainingrun.yaml", False),
    ],
    ids=["example", "own-templates", "cpu", "mixed-pools"],
)
def test_the_examples_children_are_valid_kubernetes_objects(
    kube: ControlPlane, runs: Runs, example: str, own_templates: bool
) -> None:
    """The Job, preflight Job and ConfigMap rendered from an example (and from one with prompt
    templates of its own, which the preflight mounts) pass the API server's own validation
    (volumes, security contexts, resources), checked by a server-side dry run."""
    path = EXAMPLES / example
    (doc,) = [d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "TrainingRun"]
    if own_templates:
        template = {"system": "s", "instructions": "i", "acknowledgement": "a"}
        doc["spec"]["agentLoop"]["templates"] = {"terse": template}
    spec = TrainingRunSpec.model_validate(doc["spec"])
    pools = tuple(
        ServedPool(share, f"http://{share.name}.{runs.namespace}.svc:8000", "frozen_lake")
        for share in spec.env_pools or []
    )
    target = RunTarget(
        run=Run(
            name=doc["metadata"]["name"],
            namespace=runs.namespace,
            uid="6b1a0c0e-0000-4000-8000-000000000000",
            trainer_image="reg.example/trainer:1",
            cpu_trainer_image="reg.example/trainer-cpu:1",
            preflight_image="reg.example/preflight:1",
            image_pull_policy="IfNotPresent",
        ),
        spec=spec,
        pool_url=f"http://sciworld.{runs.namespace}.svc:8000",
        env="sciworld",
        pools=pools,
    )
    children = [
        render.config_map(target),
        render.preflight_job(target),
        render.training_job(target),
    ]
    result = kube.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": children}),
    )
    assert result.stdout.count("serverside-applied (server dry run)") == 3


def test_long_run_names_are_rejected(kube: ControlPlane, runs: Runs) -> None:
    result = _dry_run_apply(kube, runs, "a" * 41, {})
    assert "TrainingRun names are at most 40 characters" in result.stderr


def test_a_run_waits_for_its_pool_then_preflights_then_trains_then_fails(
    kube: ControlPlane, runs: Runs
) -> None:
    runs.create("life", gpusPerNode=4, preflight={"episodes": 8})
    waiting = runs.wait_condition("life", "EnvPoolReady", "False", "EnvPoolNotFound")
    assert POOL in waiting["message"]
    assert runs.wait_phase("life", "WaitingForEnvPool")
    assert runs.children("life") == set()

    Cluster(runs.api, runs.namespace).create(envpool(POOL, replicas=1))
    not_ready = runs.wait_condition("life", "EnvPoolReady", "False", "EnvPoolNotReady")
    assert "not Ready" in not_ready["message"]
    assert runs.children("life") == set()

    url = make_pool_ready(kube, runs)
    runs.wait_condition("life", "EnvPoolReady", "True")
    runs.wait_condition("life", "PreflightPassed", "Unknown", "PreflightRunning")
    # Only the CPU preflight (and the run's ConfigMap) exist: no GPU before it passes.
    assert runs.children("life") == {("ConfigMap", "life-agent-loop"), ("Job", "life-preflight")}
    preflight = runs.job("life-preflight")
    container = preflight.spec.template.spec.containers[0]
    assert container.image == "reg.example/preflight:1"
    assert url in container.command
    assert container.termination_message_policy == "FallbackToLogsOnError"

    runs.finish_pod("life-preflight", 0, json.dumps(SUMMARY, separators=(",", ":")))
    passed = runs.wait_condition("life", "PreflightPassed", "True", "PreflightSucceeded")
    # One line in the condition; the whole summary in status.preflight.
    assert passed["message"] == "8 episodes; mean score 0.25; env errors: none"
    run = runs.wait_phase("life", "Starting")
    assert run["status"]["preflight"]["summary"] == SUMMARY
    assert run["status"]["envPoolUrl"] == url
    assert run["status"]["training"] == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": "life-train",
    }

    train = runs.job("life-train")
    assert train.metadata.owner_references[0].kind == "TrainingRun"
    pod = train.spec.template.spec
    trainer = pod.containers[0]
    assert trainer.image == "reg.example/trainer:1"
    assert trainer.command[:6] == [
        "gymkube-train",
        "--checkpoint-dir",
        "/checkpoints/life",
        "--model-path",
        "/models/q",
        "--",
    ]
    assert trainer.command[6:9] == ["python3", "-m", "verl.trainer.main_ppo"]
    assert trainer.termination_message_policy == "FallbackToLogsOnError"
    assert "trainer.n_gpus_per_node=4" in trainer.command
    assert trainer.resources.limits["nvidia.com/gpu"] == "4"
    assert {e.name: e.value for e in trainer.env}["GYMKUBE_ENV_URL"] == url
    assert [c.name for c in pod.init_containers] == ["dataset-train", "dataset-val"]
    shm = next(v for v in pod.volumes if v.name == "shm")
    assert shm.empty_dir.medium == "Memory"
    config = runs.core.read_namespaced_config_map("life-agent-loop", runs.namespace)
    assert url in config.data["agent-loop.yaml"]

    runs.ready_pod("life-train")
    runs.wait_condition("life", "Running", "True", "TrainingRunning")
    assert (runs.get("life") or {})["status"].get("startTime")

    # What gymkube-train writes to the termination log when verl fails.
    runs.finish_pod("life-train", 1, "ValueError: train_batch_size 3 is not divisible by 2")
    failed = runs.wait_condition("life", "Failed", "True", "TrainerFailed")
    assert failed["message"] == (
        "Job life-train failed: the trainer exited with code 1: "
        "ValueError: train_batch_size 3 is not divisible by 2"
    )
    assert runs.condition("life", "Running")["status"] == "False"
    assert (runs.get("life") or {})["status"].get("completionTime")
    runs.wait_events(
        "life", {"EnvPoolNotFound", "PreflightStarted", "PreflightSucceeded", "TrainerFailed"}
    )
    table = kube.kubectl("get", "trainingruns", "-n", runs.namespace).stdout
    header = ["NAME", "POOL", "PHASE", "NODES", "STEP", "TOTAL", "REWARD", "ETA", "RESTARTS", "AGE"]
    assert table.split()[: len(header)] == header
    assert "Failed" in table


GAME_POOL = "guess"


def test_a_run_over_two_pools_waits_for_both_then_preflights_each(
    kube: ControlPlane, runs: Runs
) -> None:
    lake = make_pool_ready(kube, runs)
    runs.create(
        "mixed",
        envPoolRef=None,
        envPools=[{"name": POOL, "weight": 3}, {"name": GAME_POOL, "promptTemplate": "terse"}],
        agentLoop={
            "templates": {"terse": {"system": "s", "instructions": "i", "acknowledgement": "a"}}
        },
        dataset={"size": 10, "valSize": 2},
        preflight={"episodes": 8},
    )
    waiting = runs.wait_condition("mixed", "EnvPoolReady", "False", "EnvPoolNotFound")
    assert waiting["message"] == f"EnvPool {GAME_POOL} does not exist in this namespace"
    assert runs.children("mixed") == set()

    guess = make_pool_ready(kube, runs, GAME_POOL, env="textarena:GuessTheNumber-v0")
    ready = runs.wait_condition("mixed", "EnvPoolReady", "True")
    assert ready["message"] == f"EnvPools {POOL}, {GAME_POOL} are Ready"
    run = runs.wait_phase("mixed", "Preflight")
    assert run["status"]["envPoolUrls"] == {POOL: lake, GAME_POOL: guess}

    # One preflight container per pool, each on its own pool with its own template.
    pod_spec = runs.job("mixed-preflight").spec.template.spec
    containers = {c.name: c.command for c in pod_spec.containers}
    assert set(containers) == {f"preflight-{POOL}", f"preflight-{GAME_POOL}"}
    assert lake in containers[f"preflight-{POOL}"]
    played = containers[f"preflight-{GAME_POOL}"]
    assert guess in played
    assert "textarena:GuessTheNumber-v0" in played
    assert played[played.index("--template") + 1] == "terse"

    # What the kubelet reports once both containers wrote their summaries.
    game = {**SUMMARY, "episodes": 8, "mean_score": 0.5}
    pod = runs.job_pod("mixed-preflight")
    statuses = [
        {
            "name": name,
            "image": "reg.example/preflight:1",
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "state": {
                "terminated": {
                    "exitCode": 0,
                    "reason": "Completed",
                    "startedAt": now(),
                    "finishedAt": now(),
                    "message": json.dumps(summary),
                }
            },
        }
        for name, summary in ((f"preflight-{POOL}", SUMMARY), (f"preflight-{GAME_POOL}", game))
    ]
    runs.core.patch_namespaced_pod_status(
        pod.metadata.name,
        runs.namespace,
        {"status": {"phase": "Succeeded", "containerStatuses": statuses}},
    )
    passed = runs.wait_condition("mixed", "PreflightPassed", "True", "PreflightSucceeded")
    assert passed["message"] == (
        f"EnvPool {POOL}: 8 episodes; mean score 0.25; env errors: none; "
        f"EnvPool {GAME_POOL}: 8 episodes; mean score 0.50; env errors: none"
    )
    run = runs.wait_phase("mixed", "Starting")
    assert run["status"]["preflight"]["summary"] == {"pools": {POOL: SUMMARY, GAME_POOL: game}}

    # The dataset: a pair of steps per pool, 10 rows split 3:1 (8 and 2), validation 1 and 1.
    train = runs.job("mixed-train").spec.template
    assert train.metadata.labels[f"clients.gymkube.io/{POOL}"] == "true"
    assert train.metadata.labels[f"clients.gymkube.io/{GAME_POOL}"] == "true"
    steps = {c.name: c.command for c in train.spec.init_containers}
    assert list(steps) == [
        f"dataset-train-{POOL}",
        f"dataset-val-{POOL}",
        f"dataset-train-{GAME_POOL}",
        f"dataset-val-{GAME_POOL}",
    ]
    sizes = {name: command[command.index("--size") + 1] for name, command in steps.items()}
    assert list(sizes.values()) == ["8", "1", "2", "1"]
    assert steps[f"dataset-train-{GAME_POOL}"][-2:] == ["--pool", GAME_POOL]
    trainer = train.spec.containers[0]
    files = f"/data/train-{POOL}.parquet','/data/train-{GAME_POOL}.parquet"
    assert f"data.train_files=['{files}']" in trainer.command
    env = {e.name: e.value for e in trainer.env}
    assert (env["GYMKUBE_ENV_URL"], env["GYMKUBE_ENV_URL_LAKE"]) == (lake, lake)
    assert (env["GYMKUBE_ENV_URL_GUESS"], env["TEXTARENA_GUESSTHENUMBER_V0_ENV_BASE"]) == (
        guess,
        guess,
    )
    config = runs.core.read_namespaced_config_map("mixed-agent-loop", runs.namespace)
    (entry,) = yaml.safe_load(config.data["agent-loop.yaml"])
    assert entry["env_urls"] == {POOL: lake, GAME_POOL: guess}


def test_a_cpu_run_trains_without_a_gpu_and_an_oom_kill_says_so(
    kube: ControlPlane, runs: Runs
) -> None:
    make_pool_ready(kube, runs)
    runs.create(
        "on-cpu",
        device="cpu",
        resources={"requests": {"memory": "6Gi"}, "limits": {"memory": "14Gi"}},
        preflight={"enabled": False},
    )
    eventually("the training Job", lambda: runs.job("on-cpu-train"))
    trainer = runs.job("on-cpu-train").spec.template.spec.containers[0]
    assert trainer.image == "reg.example/trainer-cpu:1"
    assert trainer.resources.limits == {"memory": "14Gi"}
    env = {e.name: e.value for e in trainer.env}
    assert (env["VERL_PLATFORM"], env["VERL_USE_EXTERNAL_MODULES"]) == (
        "cpu",
        "gymkube_agentloop.verl_cpu",
    )
    assert "trainer.device=cpu" in trainer.command

    # No kubelet serves this pod's log here: the run carries on without progress.
    runs.ready_pod("on-cpu-train")
    runs.wait_condition("on-cpu", "Running", "True", "TrainingRunning")
    runs.finish_pod("on-cpu-train", 137, reason="OOMKilled")
    failed = runs.wait_condition("on-cpu", "Failed", "True", "TrainerOutOfMemory")
    assert failed["message"] == (
        "Job on-cpu-train failed: the trainer was killed for memory (OOMKilled) "
        "at its memory limit of 14Gi"
    )
    assert "progress" not in (runs.get("on-cpu") or {})["status"]
    created = eventually("events", lambda: runs.events("on-cpu").get("TrainingCreated"))
    assert created.startswith("created Job on-cpu-train: on CPU, grpo on /models/q")


def test_a_disrupted_trainer_is_retried_uncounted_and_the_run_stays_running(
    kube: ControlPlane, runs: Runs
) -> None:
    make_pool_ready(kube, runs)
    runs.create("resume", preflight={"enabled": False})
    eventually("the training Job", lambda: runs.job("resume-train"))
    runs.ready_pod("resume-train")
    runs.wait_condition("resume", "Running", "True", "TrainingRunning")
    first = runs.job_pod("resume-train").metadata.name
    eventually(
        "the trainer pod followed",
        lambda: (runs.get("resume") or {})["status"].get("trainerPod") == first or None,
    )

    def restarts(count: int) -> list[dict[str, Any]]:
        def probe() -> list[dict[str, Any]] | None:
            found = (runs.get("resume") or {})["status"].get("restarts") or {}
            return found["recent"] if found.get("count") == count else None

        return eventually(f"{count} restarts in the run's status", probe)

    # Drained: the Eviction API marks the pod DisruptionTarget; gymkube-train stops on SIGTERM.
    evicted = runs.finish_pod(
        "resume-train", 75, disruption=("EvictionByEvictionAPI", "Eviction API: evicting")
    )
    (restart,) = restarts(1)
    assert (restart["pod"], restart["reason"]) == (evicted, "Evicted")
    assert restart["message"] == f"pod {evicted} was evicted (Eviction API: evicting)"
    # The Job made another pod and did not count the failure; the run never stopped Running.
    second = eventually(
        "the Job's second pod",
        lambda: next(
            (p.metadata.name for p in runs.job_pods("resume-train") if p.metadata.name != evicted),
            None,
        ),
    )
    running = runs.wait_condition("resume", "Running", "True", "TrainerRestarting")
    assert evicted in running["message"]
    assert not runs.job("resume-train").status.failed
    assert runs.get("resume")["status"]["phase"] == "Running"  # type: ignore[index]

    # Deleted: no DisruptionTarget, only gymkube-train's exit code.
    assert runs.finish_pod("resume-train", 75) == second
    _, restart = restarts(2)
    assert (restart["pod"], restart["reason"]) == (second, "Deleted")
    eventually("the Job's third pod", lambda: len(runs.job_pods("resume-train")) == 3 or None)
    runs.ready_pod("resume-train")
    runs.wait_condition("resume", "Running", "True", "TrainingRunning")
    assert not runs.job("resume-train").status.failed
    runs.wait_events("resume", {"Evicted"})

    # The trainer's own error still fails the run at once (backoffLimit 0), with its last line.
    runs.finish_pod("resume-train", 1, "RuntimeError: CUDA error: an illegal memory access")
    failed = runs.wait_condition("resume", "Failed", "True", "TrainerFailed")
    assert failed["message"].endswith("code 1: RuntimeError: CUDA error: an illegal memory access")
    assert (runs.get("resume") or {})["status"]["restarts"]["count"] == 2
    # Columns without a value print blank: the RESTARTS column is read where its header is.
    header, row = kube.kubectl(
        "get", "trainingrun", "resume", "-n", runs.namespace
    ).stdout.splitlines()
    assert row[header.index("RESTARTS") :].split()[0] == "2"


def test_a_wrong_model_path_fails_the_job_at_once_whatever_its_backoff_limit(
    kube: ControlPlane, runs: Runs
) -> None:
    make_pool_ready(kube, runs)
    runs.create("no-model", backoffLimit=3, preflight={"enabled": False})
    eventually("the training Job", lambda: runs.job("no-model-train"))
    said = "model path /models/q does not exist (/models holds: nothing)"
    runs.finish_pod("no-model-train", 2, said)
    failed = runs.wait_condition("no-model", "Failed", "True", "TrainerFailed")
    assert failed["message"] == f"Job no-model-train failed: the trainer exited with code 2: {said}"
    assert len(runs.job_pods("no-model-train")) == 1


def test_a_custom_loop_waits_for_its_config_map_then_trains_with_its_code(
    kube: ControlPlane, runs: Runs
) -> None:
    make_pool_ready(kube, runs)
    custom = {"className": "my_loops.Loop", "configMap": "my-loops"}
    runs.create("own-loop", preflight={"enabled": False}, customAgentLoop=custom)
    runs.wait_events("own-loop", {"AgentLoopCodeNotFound"})
    pending = runs.wait_condition("own-loop", "Running", "False", "Pending")
    said = "ConfigMap my-loops (customAgentLoop.configMap) is not in namespace"
    assert said in pending["message"]
    assert not runs.job("own-loop-train")

    code = {"metadata": {"name": "my-loops"}, "data": {"my_loops.py": "class Loop: ...\n"}}
    runs.core.create_namespaced_config_map(runs.namespace, code)
    job = eventually("the training Job", lambda: runs.job("own-loop-train"))
    pod = job.spec.template.spec
    config_maps = {v.name: v.config_map.name for v in pod.volumes if v.config_map}
    assert config_maps["custom-agent-loop"] == "my-loops"
    (trainer,) = pod.containers
    assert trainer.command[trainer.command.index("--agent-loop-class") + 1] == "my_loops.Loop"
    agent_loop = runs.core.read_namespaced_config_map("own-loop-agent-loop", runs.namespace)
    assert "_target_: my_loops.Loop" in agent_loop.data["agent-loop.yaml"]


def test_a_failed_preflight_fails_the_run_and_asks_for_no_gpu(
    kube: ControlPlane, runs: Runs
) -> None:
    make_pool_ready(kube, runs)
    runs.create("broken-env")
    runs.wait_phase("broken-env", "Preflight")
    summary = {"ok": False, "episodes": 8, "env_errors": {"500": 8}}
    runs.finish_pod("broken-env-preflight", 1, json.dumps(summary))
    failed = runs.wait_condition("broken-env", "Failed", "True", "PreflightFailed")
    assert (
        failed["message"]
        == "preflight Job broken-env-preflight failed: 8 episodes; env errors: 500 8"
    )
    assert runs.get("broken-env")["status"]["preflight"]["summary"] == summary  # type: ignore[index]
    assert runs.children("broken-env") == {
        ("ConfigMap", "broken-env-agent-loop"),
        ("Job", "broken-env-preflight"),
    }


def test_suspend_and_resume(kube: ControlPlane, runs: Runs) -> None:
    make_pool_ready(kube, runs)
    runs.create("pause", suspend=True, preflight={"enabled": False})
    runs.wait_condition("pause", "Suspended", "True", "Suspended")
    assert runs.children("pause") == set()

    runs.patch("pause", {"suspend": False})
    eventually("the training Job", lambda: runs.job("pause-train"))
    assert runs.job("pause-train").spec.suspend is False

    runs.patch("pause", {"suspend": True})
    eventually("the Job suspended", lambda: runs.job("pause-train").spec.suspend or None)
    runs.wait_phase("pause", "Suspended")
    runs.patch("pause", {"suspend": False})
    eventually("the Job resumed", lambda: runs.job("pause-train").spec.suspend is False or None)
    runs.wait_condition("pause", "Suspended", "False")


def test_queue_name_hands_admission_to_kueue(kube: ControlPlane, runs: Runs) -> None:
    make_pool_ready(kube, runs)
    runs.create("queued", queueName="gpu-queue", preflight={"enabled": False})
    runs.wait_condition("queued", "Suspended", "True", "WaitingForAdmission")
    job = runs.job("queued-train")
    assert job.metadata.labels["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    assert job.spec.suspend is True
    # Kueue admits the workload by unsuspending it; the operator must not suspend it again.
    runs.batch.patch_namespaced_job("queued-train", runs.namespace, {"spec": {"suspend": False}})
    runs.wait_phase("queued", "Starting")
    time.sleep(2)  # a few resyncs
    assert runs.job("queued-train").spec.suspend is False


def test_several_nodes_need_kuberay(kube: ControlPlane, runs: Runs) -> None:
    make_pool_ready(kube, runs)
    runs.create("no-ray", nodes=2, gpusPerNode=8)
    failed = runs.wait_condition("no-ray", "Failed", "True", "RayJobCRDMissing")
    assert "KubeRay" in failed["message"]
    assert runs.children("no-ray") == set()

    kube.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(RAYJOB_CRD))
    try:
        kube.kubectl("wait", "--for=condition=Established", "crd/rayjobs.ray.io", "--timeout=60s")
        runs.create("ray", nodes=2, gpusPerNode=8, preflight={"enabled": False})
        runs.wait_phase("ray", "Starting")
        rayjob = runs.custom.get_namespaced_custom_object(
            "ray.io", "v1", runs.namespace, "rayjobs", "ray-train"
        )
        spec = rayjob["spec"]
        assert spec["shutdownAfterJobFinishes"] is True
        assert "trainer.nnodes=2" in spec["entrypoint"]
        (workers,) = spec["rayClusterSpec"]["workerGroupSpecs"]
        assert workers["replicas"] == 1
        runs.custom.patch_namespaced_custom_object_status(
            "ray.io",
            "v1",
            runs.namespace,
            "rayjobs",
            "ray-train",
            {"status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}},
        )
        runs.wait_condition("ray", "Running", "True", "TrainingRunning")
    finally:
        kube.kubectl("delete", "crd", "rayjobs.ray.io", "--wait=false")


def test_an_operator_killed_mid_run_picks_up_where_it_was(kube: ControlPlane, runs: Runs) -> None:
    make_pool_ready(kube, runs)
    runs.create("restart")
    runs.wait_phase("restart", "Preflight")
    runs.operator.kill()
    runs.finish_pod("restart-preflight", 0, json.dumps(SUMMARY))
    runs.operator = runs.start_operator()
    runs.wait_condition("restart", "PreflightPassed", "True", "PreflightSucceeded")
    runs.wait_phase("restart", "Starting")
    time.sleep(2)  # a few resyncs of the new operator
    assert runs.children("restart") == {
        ("Job", "restart-preflight"),
        ("Job", "restart-train"),
        ("ConfigMap", "restart-agent-loop"),
    }
    pods = runs.core.list_namespaced_pod(
        runs.namespace, label_selector="gymkube.io/trainingrun=restart"
    ).items
    assert sorted(p.metadata.labels["app.kubernetes.io/component"] for p in pods) == [
        "preflight",
        "trainer",
    ]


def test_the_recorded_history_is_kept_bounded_across_an_operator_restart(
    kube: ControlPlane, runs: Runs
) -> None:
    make_pool_ready(kube, runs)
    runs.create("curve", preflight={"enabled": False})
    eventually("the training Job", lambda: runs.job("curve-train"))
    runs.ready_pod("curve-train")
    runs.wait_condition("curve", "Running", "True", "TrainingRunning")
    pod = runs.job_pod("curve-train").metadata.name
    # No kubelet serves the trainer's log here: the steps an operator recorded from it are
    # written as it writes them.
    steps = [
        {
            "step": n,
            "meanReward": n / 4,
            "stepSeconds": 31.5,
            "episodes": 16,
            "episodesExcluded": 1,
            "episodesReplayed": 0,
            "time": f"2026-12-01T10:0{n}:00Z",
        }
        for n in (1, 2, 3)
    ]
    history = {"pod": pod, "steps": steps}

    def patch_history(recorded: dict[str, Any]) -> None:
        runs.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, runs.namespace, PLURAL, "curve", {"status": {"history": recorded}}
        )

    patch_history(history)
    # The API server holds the bound: no more than status.history can keep.
    too_many = [{"step": n} for n in range(1, HISTORY_STEPS + 2)]
    with pytest.raises(kubernetes.client.ApiException) as refused:
        patch_history({"pod": pod, "steps": too_many})
    assert refused.value.status == 422
    assert f"must have at most {HISTORY_STEPS} items" in str(refused.value.body)

    runs.operator.kill()
    runs.operator = runs.start_operator()
    # The new operator's reconciles write the status (the trainer finishing) and keep every field.
    runs.finish_pod("curve-train", 0)
    runs.wait_condition("curve", "Succeeded", "True", "TrainingSucceeded")
    assert (runs.get("curve") or {})["status"]["history"] == history
    jsonpath = "{range .status.history.steps[*]}{.step} {.meanReward}{'\\n'}{end}"
    printed = kube.kubectl("get", "tr", "curve", "-n", runs.namespace, "-o", f"jsonpath={jsonpath}")
    assert printed.stdout.splitlines() == ["1 0.25", "2 0.5", "3 0.75"]


def test_ttl_deletes_the_finished_run_and_its_children(kube: ControlPlane, runs: Runs) -> None:
    make_pool_ready(kube, runs)
    runs.create("short", ttlSecondsAfterFinished=2, preflight={"enabled": False})
    eventually("the training Job", lambda: runs.job("short-train"))
    runs.finish_pod("short-train", 0)
    runs.wait_condition("short", "Succeeded", "True", "TrainingSucceeded")
    eventually("the run deleted by its TTL", lambda: runs.get("short") is None or None)
    # A finished run without a TTL stays, until a TTL is set on it.
    runs.create("kept", preflight={"enabled": False})
    eventually("the training Job", lambda: runs.job("kept-train"))
    runs.finish_pod("kept-train", 1)
    runs.wait_condition("kept", "Failed", "True", "TrainerFailed")
    time.sleep(2)  # a few resyncs
    assert runs.get("kept") is not None
    runs.patch("kept", {"ttlSecondsAfterFinished": 1})
    eventually("the failed run deleted once it has a TTL", lambda: runs.get("kept") is None or None)
    # The garbage collector notices a newly installed CRD's objects at its next discovery
    # (every 30 s), so this can take a while on a fresh cluster.
    eventually(
        "its Job and ConfigMap garbage-collected",
        lambda: runs.children("short") == set() or None,
        timeout=90,
    )


SERVER_ERROR = "gymkube-envserver: os has no class 'path'"


def test_a_run_on_a_crash_looping_pool_says_why_and_fails_after_its_timeout(
    kube: ControlPlane, runs: Runs
) -> None:
    cluster = Cluster(runs.api, runs.namespace)
    cluster.create(
        envpool(
            "broken",
            env="plugin:os:path",
            watchdog={"probePeriodSeconds": 2, "probeTimeoutSeconds": 1},
        )
    )
    eventually(
        "pod broken-0",
        lambda: (
            runs.core.list_namespaced_pod(
                runs.namespace, field_selector="metadata.name=broken-0"
            ).items
            or None
        ),
    )
    cluster.report_container(
        "broken-0",
        {
            "restartCount": 2,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s"}},
            "lastState": {
                "terminated": {"exitCode": 2, "reason": "Error", "message": f"{SERVER_ERROR}\n"}
            },
        },
    )
    runs.create("on-broken", envPoolRef={"name": "broken"}, envPoolTimeoutSeconds=60)
    waiting = runs.wait_condition("on-broken", "EnvPoolReady", "False", "EnvPoolDegraded")
    assert waiting["message"] == (
        "EnvPool broken is Degraded (ServerCrashLoop: pod broken-0: exited with code 2, "
        f"2 restarts: {SERVER_ERROR})"
    )
    assert runs.get("on-broken")["status"]["phase"] == "WaitingForEnvPool"  # type: ignore[index]
    failed = runs.wait_condition("on-broken", "Failed", "True", "EnvPoolTimeout", timeout=90)
    assert failed["message"].startswith("waited 6")
    assert (
        "(envPoolTimeoutSeconds: 60) for its pool; last seen: EnvPool broken is Degraded"
        in (failed["message"])
    )
    assert SERVER_ERROR in failed["message"]
    assert runs.children("on-broken") == set()
    runs.wait_events("on-broken", {"EnvPoolDegraded", "EnvPoolTimeout"})


def test_a_misspelled_override_fails_the_run_and_no_job_is_ever_created(
    kube: ControlPlane, runs: Runs
) -> None:
    make_pool_ready(kube, runs)
    runs.create("typo", overrides=["actor_rollout_ref.rollout.n=4", "trainer.total_epoch=3"])
    failed = runs.wait_condition("typo", "Failed", "True", "InvalidOverride")
    assert failed["message"] == (
        "spec.overrides[1] 'trainer.total_epoch=3': verl 0.9.1's ppo_trainer config has no key "
        "trainer.total_epoch; did you mean trainer.total_epochs? (a key verl does not define is "
        "added with +trainer.total_epoch=...)"
    )
    time.sleep(2)  # a few resyncs
    assert runs.children("typo") == set()
    assert runs.job("typo-train") is None
    # The same run spelled right goes on to its preflight.
    runs.create("spelled", overrides=["actor_rollout_ref.rollout.n=4", "trainer.total_epochs=3"])
    runs.wait_phase("spelled", "Preflight")


def test_an_autoscaled_pool_grows_for_its_runs_demand_and_goes_to_zero_after_it(
    kube: ControlPlane, runs: Runs
) -> None:
    cluster = Cluster(runs.api, runs.namespace)
    name = "autoscaled"
    autoscaling = {"minReplicas": 0, "maxReplicas": 5, "scaleDownDelaySeconds": 0}
    cluster.create(
        envpool(
            name, replicas=0, sessionsPerReplica=4, idleTimeoutSeconds=2, autoscaling=autoscaling
        )
    )

    def pool_state() -> tuple[int, int | None, str | None]:
        pool = cluster.get(name) or {}
        ready = next(
            (c for c in pool.get("status", {}).get("conditions", []) if c["type"] == "Ready"), {}
        )
        status = pool.get("status", {})
        return pool["spec"]["replicas"], status.get("demand"), ready.get("reason")

    eventually("the pool at zero", lambda: pool_state() == (0, 0, "ScaledToZero") or None)

    # A run of 2 prompts x 4 rollouts keeps 8 sessions open: two servers of 4, before any batch.
    runs.create(
        "hungry",
        envPoolRef={"name": name},
        preflight={"enabled": False},
        overrides=[
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=4",
            "trainer.val_before_train=false",
        ],
    )
    eventually(
        "the run's demand", lambda: (runs.get("hungry") or {}).get("status", {}).get("demand")
    )
    assert runs.get("hungry")["status"]["demand"] == {  # type: ignore[index]
        "sessions": 8,
        "training": 8,
        "validation": 0,
        "pools": {name: 8},
    }
    eventually("the pool scaled up", lambda: pool_state()[:2] == (2, 8) or None)
    # kopf posts events from a queue of its own, so the Event may trail the patch.
    up = "0 -> 2 env servers: runs' demand 8 sessions, 0 open, 0 waiting"
    eventually(
        f"the Scaled event {up!r}",
        lambda: up in [e.message for e in cluster.events(name) if e.reason == "Scaled"] or None,
    )
    runs.wait_condition("hungry", "EnvPoolSized", "True", "CapacityMeetsDemand")

    # Once no run uses it and no session was open for idleTimeoutSeconds, back to zero.
    runs.custom.delete_namespaced_custom_object(GROUP, VERSION, runs.namespace, PLURAL, "hungry")
    eventually("the pool back at zero", lambda: pool_state() == (0, 0, "ScaledToZero") or None)
