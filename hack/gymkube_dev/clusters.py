"""Which cluster `make up` uses (kind, else the local single-node cluster), bringing it up and
taking it down through hack/kind-*.sh and hack/local-cluster.sh."""

import shutil
from pathlib import Path

from gymkube_dev import HACK
from gymkube_dev.console import quiet, run_streamed, say
from gymkube_dev.errors import StepError
from gymkube_dev.kube import Kube
from gymkube_dev.settings import ClusterKind, UpSettings, UpState, save_state

KIND_MIN_CPUS = 2
"""CPUs a kind node needs for `make up`'s examples (their small-node profile) next to kind's own
control-plane pods."""
LOCAL_CLUSTER = str(HACK / "local-cluster.sh")


def kind_settings() -> dict[str, str]:
    """KIND_NAME, KIND_KUBECONFIG and the node image a new cluster would start from ("" when
    there is none: kindest/node cannot be pulled and `make kind-node-image` has not run), as
    hack/lib/kind-common.sh sets them."""
    out = quiet(
        [
            "bash",
            "-c",
            'source hack/lib/kind-common.sh && printf "%s\\n" "$KIND_NAME" "$KIND_KUBECONFIG" '
            '"$(kind_node_image || true)"',
        ]
    )
    if out.returncode != 0:
        raise StepError(f"hack/lib/kind-common.sh: {out.stderr.strip()}")
    name, kubeconfig, image = out.stdout.split("\n")[:3]
    return {"name": name, "image": image, "kubeconfig": kubeconfig}


def docker_answers() -> bool:
    return shutil.which("docker") is not None and quiet(["docker", "info"]).returncode == 0


def docker_cpus() -> int:
    out = quiet(["docker", "info", "--format", "{{.NCPU}}"])
    return int(out.stdout.strip()) if out.stdout.strip().isdigit() else 0


def kind_cluster_exists(name: str) -> bool:
    if not docker_answers():
        return False
    out = quiet(["docker", "ps", "-aq", "--filter", f"label=io.x-k8s.kind.cluster={name}"])
    return bool(out.stdout.strip())


def local_cluster_running() -> bool:
    return quiet([LOCAL_CLUSTER, "status"]).returncode == 0


def choose_cluster(settings: UpSettings, kind: dict[str, str]) -> tuple[ClusterKind, str]:
    """(kind|local, why)."""
    if settings.cluster != "auto":
        return settings.cluster, "GYMKUBE_UP_CLUSTER"
    if kind_cluster_exists(kind["name"]):
        return "kind", f"the kind cluster {kind['name']} exists"
    if local_cluster_running():
        return "local", "the local cluster is running"
    if not docker_answers():
        return "local", "Docker does not answer here (kind runs its node in Docker)"
    if kind["image"]:
        cpus = docker_cpus()
        if cpus >= KIND_MIN_CPUS:
            return "kind", f"kind's node image {kind['image']} can be had"
        # kind's control plane runs as pods that take 850m: on a small node the examples' CPU
        # training run would stay Pending (docs/cluster.md), while the local cluster fits it.
        return (
            "local",
            f"a kind node here would have {cpus} CPUs (the examples need {KIND_MIN_CPUS})",
        )
    return "local", "no kind node image here (no registry, and `make kind-node-image` has not run)"


def cluster_uid(kubeconfig: Path) -> str:
    """kube-system's UID: a new cluster behind the same kubeconfig path has a new one."""
    namespace = Kube(kubeconfig).get("/api/v1/namespaces/kube-system") or {}
    return str(namespace.get("metadata", {}).get("uid", ""))


def cluster_up(settings: UpSettings, state: UpState) -> tuple[ClusterKind, Path]:
    kind = kind_settings()
    flavour, why = choose_cluster(settings, kind)
    say(f"cluster: {flavour} ({why})")
    if flavour == "kind":
        was_running = kind_cluster_exists(kind["name"])
        lines = run_streamed([str(HACK / "kind-up.sh")], what="kind cluster")
    else:
        was_running = local_cluster_running()
        lines = run_streamed([LOCAL_CLUSTER, "up"], what="local cluster")
    if not lines:
        raise StepError("the cluster script printed no kubeconfig path")
    kubeconfig = Path(lines[-1].strip())
    uid = cluster_uid(kubeconfig)
    same_cluster = state.cluster == flavour and state.cluster_uid == uid
    state.started_cluster = (state.started_cluster and same_cluster) or not was_running
    if not same_cluster:
        state.loaded_images = {}
    state.cluster, state.kubeconfig, state.cluster_uid = flavour, str(kubeconfig), uid
    save_state(state)
    return flavour, kubeconfig


def load_images(flavour: ClusterKind, refs: list[str]) -> None:
    if flavour == "kind":
        run_streamed([str(HACK / "kind-up.sh"), *refs], what="kind load")
    else:
        run_streamed([LOCAL_CLUSTER, "load-image", *refs], what="image load")


def running_cluster(state: UpState) -> tuple[ClusterKind, Path] | None:
    """The cluster `make up` used (or one that runs now) and its kubeconfig; None when none."""
    kind = kind_settings()
    flavour = state.cluster or (
        "kind"
        if kind_cluster_exists(kind["name"])
        else "local"
        if local_cluster_running()
        else None
    )
    if flavour is None:
        return None
    if state.kubeconfig:
        return flavour, Path(state.kubeconfig)
    if flavour == "kind":
        return flavour, Path(kind["kubeconfig"])
    return flavour, Path(quiet([LOCAL_CLUSTER, "kubeconfig"]).stdout.strip())


def stop_cluster(flavour: ClusterKind) -> None:
    script = [str(HACK / "kind-down.sh")] if flavour == "kind" else [LOCAL_CLUSTER, "down"]
    run_streamed(script, what=f"{flavour} cluster down")
