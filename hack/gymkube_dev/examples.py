"""The examples `make up` applies (examples/*.yaml, lighter on a small node), and the steps that
apply, re-run, roll and delete them."""

import copy
from datetime import UTC, datetime
from typing import Any

import yaml
from gymkube_operator.kinds import API_VERSION, GROUP
from gymkube_operator.trainingrun.reasons import ConditionType as Run

from gymkube_dev import REPO
from gymkube_dev.console import poll, say
from gymkube_dev.errors import StepError
from gymkube_dev.images import image_ref
from gymkube_dev.kube import PLURALS, Kube, api_path, gymkube_path
from gymkube_dev.objects import Object, condition, condition_is, cpu_cores, rolled_out
from gymkube_dev.settings import FIELD_MANAGER, SMALL_NODE_CPUS, UpSettings

EXAMPLES = (
    REPO / "examples" / "envpool-sciworld.yaml",
    REPO / "examples" / "envpool-frozenlake.yaml",
    REPO / "examples" / "trainingrun-frozenlake-preflight.yaml",
    REPO / "examples" / "envpool-frozenlake-easy.yaml",
    REPO / "examples" / "trainingrun-frozenlake-cpu.yaml",
)
# Merged into the examples on a small node (a laptop's kind, a 2-core CI machine): the same pools
# with fewer warm JVMs and requests that fit next to the control plane.
SMALL_NODE_OVERRIDES: dict[tuple[str, str], dict[str, Any]] = {
    ("EnvPool", "sciworld"): {
        "sessionsPerReplica": 4,
        "warmSessionsPerReplica": 1,
        "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"memory": "3Gi"}},
        "router": {"resources": {"requests": {"cpu": "20m", "memory": "64Mi"}}},
    },
    ("EnvPool", "frozen-lake"): {
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}},
        "router": {"resources": {"requests": {"cpu": "20m", "memory": "64Mi"}}},
    },
    ("EnvPool", "frozen-lake-easy"): {
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}},
        "router": {"resources": {"requests": {"cpu": "20m", "memory": "64Mi"}}},
    },
    # A request, not a limit: the trainer still uses every idle core. On a 2-CPU kind node the
    # control plane's pods hold 950m, and a 1-CPU request would leave the run Pending.
    ("TrainingRun", "frozen-lake-cpu"): {"resources": {"requests": {"cpu": "400m"}}},
}
DELETE_TIMEOUT_S = 120.0
RUN_DELETE_TIMEOUT_S = 180.0


def gymkube_object(kube: Kube, kind: str, namespace: str, name: str) -> Object | None:
    return kube.get(gymkube_path(PLURALS[kind], namespace, name))


def small_node(kube: Kube, settings: UpSettings) -> tuple[bool, str]:
    if settings.profile != "auto":
        return settings.profile == "small", "GYMKUBE_UP_PROFILE"
    nodes = kube.list_objects("/api/v1/nodes")
    cpus = sum(
        cpu_cores((n.get("status") or {}).get("allocatable", {}).get("cpu", "0")) for n in nodes
    )
    return cpus < SMALL_NODE_CPUS, f"the cluster has {cpus:g} allocatable CPUs"


def deep_merge(base: Object, extra: Object) -> Object:
    merged = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def example_objects(small: bool) -> list[Object]:
    objects: list[Object] = []
    for path in EXAMPLES:
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            key = (doc["kind"], doc["metadata"]["name"])
            if small and key in SMALL_NODE_OVERRIDES:
                doc = deep_merge(doc, {"spec": SMALL_NODE_OVERRIDES[key]})
            objects.append(doc)
    return objects


def wait_deleted(
    kube: Kube, settings: UpSettings, what: str, paths: dict[str, str], timeout: float
) -> None:
    """Waits until none of PATHS (kind/name -> REST path) exists, printing what is left."""

    def gone() -> tuple[bool, str]:
        left = [ref for ref, path in paths.items() if kube.get(path) is not None]
        return not left, f"waiting for {', '.join(left)}" if left else "all deleted"

    poll(what, gone, timeout, settings.poll_interval_s, "deleted")


def retry_failed_runs(kube: Kube, settings: UpSettings, objects: list[Object]) -> None:
    """A finished TrainingRun is a record and never runs again: an example run that Failed last
    time is deleted, so this `up` runs it anew (a Succeeded one is kept and reported)."""
    for obj in objects:
        name = obj["metadata"]["name"]
        if obj["kind"] != "TrainingRun":
            continue
        found = gymkube_object(kube, "TrainingRun", settings.namespace, name)
        if found is None or not condition_is(found, Run.FAILED):
            continue
        why = (condition(found, Run.FAILED) or {}).get("reason")
        say(f"  trainingrun/{name} failed last time ({why}): deleting it to run it again")
        path = gymkube_path(PLURALS["TrainingRun"], settings.namespace, name)
        kube.delete(path)
        ref = f"trainingrun/{name}"
        wait_deleted(kube, settings, ref, {ref: path}, RUN_DELETE_TIMEOUT_S)


def apply_examples(kube: Kube, settings: UpSettings, objects: list[Object]) -> None:
    for obj in objects:
        say(f"  {kube.apply(obj, field_manager=FIELD_MANAGER, namespace=settings.namespace)}")


def restart_pools(
    kube: Kube, settings: UpSettings, objects: list[Object], replaced: set[str]
) -> None:
    """Pods keep the image they started with when a rebuild reuses its tag: roll the example
    pools' servers and routers onto the new build (one pod at a time, draining as the operator
    does for any rollout), as `kubectl rollout restart` does."""
    ns = settings.namespace
    targets = []
    for obj in objects:
        if obj["kind"] != "EnvPool":
            continue
        name = obj["metadata"]["name"]
        if image_ref("envserver") in replaced:
            targets.append(("statefulsets", f"statefulset/{name}", name))
        if image_ref("router") in replaced:
            targets.append(("deployments", f"deployment/{name}-router", f"{name}-router"))
    restarted_at = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    restart = {"kubectl.kubernetes.io/restartedAt": restarted_at}
    for plural, ref, name in targets:
        path = api_path("apps/v1", plural, ns, name)
        if kube.get(path) is None:
            continue  # a new pool starts on the new image anyway
        say(f"  {ref}: its image was rebuilt, restarting it")
        kube.patch(path, {"spec": {"template": {"metadata": {"annotations": restart}}}})

        def check(path: str = path) -> tuple[bool, str]:
            return rolled_out(kube.get(path))

        poll(ref, check, settings.pool_timeout_s, settings.poll_interval_s, "rolled out")


def delete_examples(kube: Kube, settings: UpSettings) -> None:
    """Deletes the example run and pools and waits until they are gone. Their finalizers are the
    operator's; if it does not release them in time (it is not running), they are removed here,
    and the children go with their owner references."""
    if kube.get(f"/apis/{API_VERSION}") is None:
        say("  the gymkube CRDs are not installed: no examples to delete")
        return
    ns = settings.namespace
    paths = {}
    for obj in reversed(example_objects(small=False)):
        kind, name = obj["kind"], obj["metadata"]["name"]
        path = paths[f"{kind.lower()}/{name}"] = gymkube_path(PLURALS[kind], ns, name)
        if kube.delete(path):
            say(f'  {kind.lower()}.{GROUP} "{name}" deleted')
    try:
        wait_deleted(kube, settings, "examples", paths, DELETE_TIMEOUT_S)
    except StepError:
        say("  the operator did not release them in time: removing their finalizers")
        for path in paths.values():
            if kube.get(path) is not None:
                kube.patch(path, {"metadata": {"finalizers": None}})
        wait_deleted(kube, settings, "examples", paths, 60)
