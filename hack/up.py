"""`make up` and `make down`: gymkube running on a cluster in one command, and gone in another.

    .venv/bin/python hack/up.py up      # cluster, images, chart, example pools, a preflight run
    .venv/bin/python hack/up.py down    # undoes `up`

`up` brings up a cluster (kind where Docker can get kind's node image, else the local single-node
cluster of hack/local-cluster.sh), builds the images (`make images`, skipped when nothing that goes
into them changed), loads them into the cluster, installs the chart through pyhelm3, applies
examples/envpool-sciworld.yaml, examples/envpool-frozenlake.yaml and
examples/trainingrun-frozenlake-preflight.yaml, waits on their conditions (printing every change),
and prints each pool's URL and status and the run's preflight summary. Every step is idempotent, so
running `up` again repairs or confirms what is there. On a small node the examples are applied with
lighter resources (SMALL_NODE_OVERRIDES). A failed wait prints operator logs, events and pod
descriptions and saves them to $GYMKUBE_CACHE/up/diagnostics.txt.

`down` deletes the examples, uninstalls the chart, and stops the cluster if `up` started it (a
cluster that was already running is left as it was). docs/quickstart.md has the details; settings
are GYMKUBE_UP_* environment variables (UpSettings).
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import logging
import os
import selectors
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from gymkube_agentloop.train import PROGRESS_PREFIX
from gymkube_operator.envpool.reasons import STUCK
from gymkube_operator.envpool.reasons import ConditionType as Pool
from gymkube_operator.trainingrun.reasons import ConditionType as Run
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from pydantic import BaseModel, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict
from pyhelm3 import Client as HelmClient

REPO = Path(__file__).resolve().parents[1]
HACK = REPO / "hack"
CHART = REPO / "charts" / "gymkube"
GROUP, VERSION = "gymkube.io", "v1alpha1"
IMAGES = ("envserver", "router", "operator", "preflight", "trainer-cpu")
# What goes into the images: a change here means `make images` must run again.
IMAGE_INPUTS = (
    "images",
    "operator",
    "agentloop",
    "requirements",
    "hack/build-images.sh",
    "hack/base-image.sh",
    ".dockerignore",
    "charts/gymkube/Chart.yaml",
)
EXAMPLES = (
    REPO / "examples" / "envpool-sciworld.yaml",
    REPO / "examples" / "envpool-frozenlake.yaml",
    REPO / "examples" / "trainingrun-frozenlake-preflight.yaml",
    REPO / "examples" / "envpool-frozenlake-easy.yaml",
    REPO / "examples" / "trainingrun-frozenlake-cpu.yaml",
)
# Nodes with fewer CPUs than this get SMALL_NODE_OVERRIDES (the examples ask for about 4.5).
SMALL_NODE_CPUS = 8.0
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
}
HEARTBEAT_S = 20.0
# pyhelm3 logs every non-zero helm exit as a warning, the `helm status` it runs to learn that a
# first install has no release yet included; a real failure raises, and `up` reports it.
logging.getLogger("pyhelm3.command").setLevel(logging.ERROR)
EXAMPLES_DELETE_TIMEOUT_S = 120.0
# Degraded reasons that no amount of waiting fixes (docs/envpool.md), named by the operator.
POOL_STUCK = STUCK

Object = dict[str, Any]
ClusterKind = Literal["kind", "local"]


class UpSettings(BaseSettings):
    """GYMKUBE_UP_* environment variables."""

    model_config = SettingsConfigDict(env_prefix="GYMKUBE_UP_", frozen=True)

    cluster: Literal["auto", "kind", "local"] = Field(
        "auto",
        description="auto: a running kind or local cluster, else kind when its node image can be "
        "had, else the local cluster.",
    )
    images: Literal["auto", "always"] = Field(
        "auto", description="auto: run `make images` only when an image input changed."
    )
    profile: Literal["auto", "small", "full"] = Field(
        "auto",
        description=f"small: SMALL_NODE_OVERRIDES; auto: small below {SMALL_NODE_CPUS} CPUs.",
    )
    namespace: str = Field("default", description="Namespace of the example pools and run.")
    release: str = Field("gymkube", description="Helm release of the operator.")
    operator_namespace: str = Field("gymkube-system", description="Namespace of the release.")
    operator_timeout_s: float = Field(300.0, description="Chart installed → operator ready.")
    pool_timeout_s: float = Field(900.0, description="EnvPool applied → Ready.")
    preflight_timeout_s: float = Field(900.0, description="Pool Ready → preflight passed.")
    training_timeout_s: float = Field(
        1800.0, description="Preflight passed → the CPU training run Succeeded."
    )
    down_cluster: Literal["auto", "always", "never"] = Field(
        "auto", description="`down` stops the cluster: auto = only when `up` started it."
    )
    poll_interval_s: float = Field(2.0, description="Seconds between status reads.")


class UpState(BaseModel):
    """What `up` did, kept in $GYMKUBE_CACHE/up/state.json for the next `up` and for `down`."""

    cluster: ClusterKind | None = None
    kubeconfig: str | None = None
    started_cluster: bool = False
    cluster_uid: str | None = None
    image_inputs: dict[str, str] = Field(default_factory=dict)
    built_images: dict[str, str] = Field(default_factory=dict)
    loaded_images: dict[str, str] = Field(default_factory=dict)


class UpError(Exception):
    """A step failed; the message says which and what to do."""


# --- output --------------------------------------------------------------------------------------

STARTED = time.monotonic()


def clock() -> str:
    seconds = int(time.monotonic() - STARTED)
    return f"{seconds // 60:2d}:{seconds % 60:02d}"


def say(message: str) -> None:
    print(f"[{clock()}] {message}", flush=True)


def step(title: str) -> None:
    print(f"\n[{clock()}] ==> {title}", flush=True)


def duration(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def run_streamed(cmd: Sequence[str], *, what: str, env: dict[str, str] | None = None) -> list[str]:
    """Runs CMD, echoing its output indented, with a heartbeat while it is silent; returns its
    stdout lines. Raises UpError naming WHAT when it fails."""
    started = time.monotonic()
    proc = subprocess.Popen(
        list(cmd),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    stdout: list[str] = []
    # Raw reads on the pipes: a buffered readline could sit on lines select() no longer reports.
    pending = {proc.stdout.fileno(): b"", proc.stderr.fileno(): b""}
    selector = selectors.DefaultSelector()
    for fd in pending:
        selector.register(fd, selectors.EVENT_READ)
    last_output = time.monotonic()
    while pending:
        for key, _ in selector.select(timeout=1.0):
            fd = int(key.fd)
            chunk = os.read(fd, 65536)
            lines = (pending[fd] + chunk).split(b"\n")
            if chunk:
                pending[fd] = lines.pop()
            else:
                selector.unregister(fd)
                del pending[fd]
            for raw in filter(None, lines):
                line = raw.decode(errors="replace").rstrip()
                if fd == proc.stdout.fileno():
                    stdout.append(line)
                print(f"    {line}", flush=True)
                last_output = time.monotonic()
        if time.monotonic() - last_output >= HEARTBEAT_S:
            say(f"  ... {what}: still working ({duration(time.monotonic() - started)})")
            last_output = time.monotonic()
    proc.stdout.close()
    proc.stderr.close()
    if proc.wait() != 0:
        raise UpError(f"{what} failed (exit {proc.returncode}); its output is above")
    say(f"  {what}: done in {duration(time.monotonic() - started)}")
    return stdout


def quiet(cmd: Sequence[str], *, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(cmd), cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )


# --- state ---------------------------------------------------------------------------------------


def cache_dir() -> Path:
    return Path(os.environ.get("GYMKUBE_CACHE") or Path.home() / ".cache" / "gymkube") / "up"


def load_state() -> UpState:
    path = cache_dir() / "state.json"
    if not path.exists():
        return UpState()
    try:
        return UpState.model_validate_json(path.read_text())
    except ValueError:
        return UpState()  # an unreadable record is no record: every step checks the real state


def save_state(state: UpState) -> None:
    cache_dir().mkdir(parents=True, exist_ok=True)
    (cache_dir() / "state.json").write_text(state.model_dump_json(indent=2))


# --- tools and clusters --------------------------------------------------------------------------


def tool(name: str) -> str:
    tool_dir = quiet([str(HACK / "tool-path.sh")]).stdout.strip()
    path = Path(tool_dir) / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        raise UpError(f"{name} not found: `hack/build-tools.sh {name}` builds it")
    return found


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
        raise UpError(f"hack/lib/kind-common.sh: {out.stderr.strip()}")
    name, kubeconfig, image = out.stdout.split("\n")[:3]
    return {"name": name, "image": image, "kubeconfig": kubeconfig}


KIND_MIN_CPUS = 4
"""CPUs a kind node needs for `make up`'s examples next to kind's own control-plane pods."""


def docker_answers() -> bool:
    return shutil.which("docker") is not None and quiet(["docker", "info"]).returncode == 0


def kind_cluster_exists(name: str) -> bool:
    if not docker_answers():
        return False
    out = quiet(["docker", "ps", "-aq", "--filter", f"label=io.x-k8s.kind.cluster={name}"])
    return bool(out.stdout.strip())


def local_cluster_running() -> bool:
    return quiet([str(HACK / "local-cluster.sh"), "status"]).returncode == 0


def choose_cluster(settings: UpSettings, kind: dict[str, str]) -> tuple[ClusterKind, str]:
    """(kind|local, why)."""
    if settings.cluster != "auto":
        return settings.cluster, "GYMKUBE_UP_CLUSTER"
    if kind_cluster_exists(kind["name"]):
        return "kind", f"the kind cluster {kind['name']} exists"
    if local_cluster_running():
        return "local", "the local cluster is running"
    if docker_answers() and kind["image"]:
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


def docker_cpus() -> int:
    out = quiet(["docker", "info", "--format", "{{.NCPU}}"])
    return int(out.stdout.strip()) if out.stdout.strip().isdigit() else 0


def cluster_up(settings: UpSettings, state: UpState) -> tuple[ClusterKind, Path]:
    kind = kind_settings()
    flavour, why = choose_cluster(settings, kind)
    say(f"cluster: {flavour} ({why})")
    if flavour == "kind":
        was_running = kind_cluster_exists(kind["name"])
        lines = run_streamed([str(HACK / "kind-up.sh")], what="kind cluster")
    else:
        was_running = local_cluster_running()
        lines = run_streamed([str(HACK / "local-cluster.sh"), "up"], what="local cluster")
    if not lines:
        raise UpError("the cluster script printed no kubeconfig path")
    kubeconfig = Path(lines[-1].strip())
    uid = cluster_uid(kubeconfig)
    same_cluster = state.cluster == flavour and state.cluster_uid == uid
    state.started_cluster = (state.started_cluster and same_cluster) or not was_running
    if not same_cluster:
        state.loaded_images = {}
    state.cluster, state.kubeconfig, state.cluster_uid = flavour, str(kubeconfig), uid
    save_state(state)
    return flavour, kubeconfig


def cluster_uid(kubeconfig: Path) -> str:
    """kube-system's UID: a new cluster behind the same kubeconfig path has a new one."""
    namespace = Kube(kubeconfig).get("/api/v1/namespaces/kube-system") or {}
    return str(namespace.get("metadata", {}).get("uid", ""))


# --- images --------------------------------------------------------------------------------------


def image_tag() -> str:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return str(chart["appVersion"])


def image_refs() -> list[str]:
    tag = image_tag()
    return [f"gymkube/{name}:{tag}" for name in IMAGES]


def image_inputs() -> dict[str, str]:
    """Every file (tracked or not, unless ignored) that goes into the images, with its hash."""
    listed = quiet(["git", "ls-files", "-co", "--exclude-standard", "-z", "--", *IMAGE_INPUTS])
    if listed.returncode != 0:
        raise UpError(f"git ls-files failed: {listed.stderr.strip()}")
    hashes = {}
    for name in sorted(filter(None, listed.stdout.split("\0"))):
        path = REPO / name
        if path.is_file():
            hashes[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


def why_build(
    settings: UpSettings, state: UpState, inputs: dict[str, str], have: dict[str, str]
) -> str | None:
    """Why `make images` must run, or None when the images are current."""
    if settings.images == "always":
        return "GYMKUBE_UP_IMAGES=always"
    missing = [ref for ref in image_refs() if ref not in have]
    if missing:
        return f"Docker lacks {', '.join(missing)}"
    if not state.image_inputs:
        return "no build by `make up` recorded"
    if state.built_images != have:
        return "the images were rebuilt outside `make up`"
    changed = sorted(set(inputs.items()) ^ set(state.image_inputs.items()))
    names = sorted({name for name, _ in changed})
    if names:
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        return f"changed since the last build: {', '.join(names[:3])}{more}"
    return None


def docker_image_ids(refs: Sequence[str]) -> dict[str, str]:
    ids = {}
    for ref in refs:
        out = quiet(["docker", "image", "inspect", "--format", "{{.Id}}", ref])
        if out.returncode == 0:
            ids[ref] = out.stdout.strip()
    return ids


def build_images(settings: UpSettings, state: UpState) -> dict[str, str]:
    refs = image_refs()
    inputs = image_inputs()
    reason = why_build(settings, state, inputs, docker_image_ids(refs) if docker_answers() else {})
    if reason is None:
        say(f"images: up to date ({', '.join(refs)}); GYMKUBE_UP_IMAGES=always rebuilds")
        return state.built_images
    say(f"images: building ({reason})")
    run_streamed(["make", "--no-print-directory", "images"], what="make images")
    built = docker_image_ids(refs)
    missing = sorted(set(refs) - set(built))
    if missing:
        raise UpError(f"`make images` did not produce {', '.join(missing)}")
    state.image_inputs, state.built_images = inputs, built
    save_state(state)
    return built


def node_image_names(kube: Kube) -> set[str]:
    names: set[str] = set()
    for node in kube.items("/api/v1/nodes"):
        for image in (node.get("status") or {}).get("images") or []:
            names.update(image.get("names") or [])
    return names


def load_images(flavour: str, kube: Kube, state: UpState, ids: dict[str, str]) -> set[str]:
    """Loads the images the cluster lacks; returns those that replaced an older build."""
    on_nodes = node_image_names(kube)
    stale = [
        ref
        for ref, image_id in ids.items()
        if state.loaded_images.get(ref) != image_id or not ({ref, f"docker.io/{ref}"} & on_nodes)
    ]
    if not stale:
        say("images: already loaded into the cluster")
        return set()
    if flavour == "kind":
        run_streamed([str(HACK / "kind-up.sh"), *stale], what="kind load")
    else:
        run_streamed([str(HACK / "local-cluster.sh"), "load-image", *stale], what="image load")
    replaced = {ref for ref in stale if state.loaded_images.get(ref) not in (None, ids[ref])}
    state.loaded_images.update({ref: ids[ref] for ref in stale})
    save_state(state)
    return replaced


# --- Kubernetes helpers --------------------------------------------------------------------------


@dataclass
class Kube:
    """The cluster behind a kubeconfig, read as plain JSON objects (as kubectl shows them)."""

    kubeconfig: Path
    api: k8s.ApiClient = field(init=False)

    def __post_init__(self) -> None:
        self.api = k8s_config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]

    def get(self, path: str, query: dict[str, str] | None = None) -> Object | None:
        """GET PATH (e.g. /api/v1/nodes); None when it does not exist."""
        payload = self.get_bytes(path, query, accept="application/json")
        if payload is None:
            return None
        obj: Object = json.loads(payload)
        return obj

    def get_bytes(
        self, path: str, query: dict[str, str] | None = None, accept: str = "*/*"
    ) -> bytes | None:
        """GET PATH as it answers (a pod log, a proxied /metrics); None when it does not exist."""
        method, url, headers, _, _ = self.api.param_serialize(
            "GET",
            path,
            query_params=list((query or {}).items()),
            header_params={"Accept": accept},
            auth_settings=["BearerToken"],
        )
        try:
            response = self.api.call_api(method, url, headers, _request_timeout=30)
        except Exception as err:  # urllib3's connection, TLS and timeout errors
            raise UpError(
                f"the API server in {self.kubeconfig} does not answer ({type(err).__name__}); "
                "is the cluster still up?"
            ) from err
        payload: bytes = response.response.data
        if response.status == 404:
            return None
        if response.status != 200:
            raise UpError(f"GET {path} answered {response.status}: {payload[:300]!r}")
        return payload

    def items(self, path: str, selector: str = "") -> list[Object]:
        found = self.get(path, {"labelSelector": selector} if selector else None) or {}
        items: list[Object] = found.get("items") or []
        return items

    def gymkube_object(self, kind: str, namespace: str, name: str) -> Object | None:
        return self.get(f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{plural(kind)}/{name}")

    def kubectl(
        self, *args: str, stdin: str | None = None, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [tool("kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def reachable(self) -> bool:
        try:
            self.get("/api/v1/namespaces", {"limit": "1"})
        except Exception:  # any failure means: no cluster answers at this kubeconfig
            return False
        return True


def plural(kind: str) -> str:
    return {"EnvPool": "envpools", "TrainingRun": "trainingruns"}[kind]


def condition(obj: Object | None, kind: str) -> Object | None:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def condition_true(obj: Object | None, kind: str) -> bool:
    cond = condition(obj, kind)
    return cond is not None and cond.get("status") == "True"


def current(obj: Object) -> bool:
    """The operator has acted on the object's latest spec."""
    observed = (obj.get("status") or {}).get("observedGeneration", 0)
    return int(observed) >= int(obj["metadata"].get("generation", 0))


def cpu_cores(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


# --- chart ---------------------------------------------------------------------------------------


def chart_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in CHART.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(CHART)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def chart_values(operator_image_id: str) -> Object:
    """Default images are the chart's (gymkube/<name>:<appVersion>, IfNotPresent), which is what
    was loaded. The annotations roll the operator when its image or the chart changed."""
    return {
        "podAnnotations": {
            "gymkube.io/operator-image": operator_image_id,
            "gymkube.io/chart": chart_digest(),
        }
    }


def install_chart(kube: Kube, settings: UpSettings, operator_image_id: str) -> None:
    # Helm installs crds/ only on first install and never upgrades them: apply them first so a
    # changed CRD takes effect on the next `make up` too.
    crds = kube.kubectl(
        "apply", "--server-side", "--force-conflicts", "--field-manager=gymkube-up",
        "-f", str(CHART / "crds"),
    )  # fmt: skip
    if crds.returncode != 0:
        raise UpError(f"applying the CRDs failed: {crds.stderr.strip()}")
    say("CRDs applied: envpools.gymkube.io, trainingruns.gymkube.io")
    helm = HelmClient(executable=tool("helm"), kubeconfig=kube.kubeconfig)

    async def ensure() -> int:
        chart = await helm.get_chart(str(CHART))
        revision = await helm.ensure_release(
            settings.release,
            chart,
            chart_values(operator_image_id),
            namespace=settings.operator_namespace,
            create_namespace=True,
            timeout="5m",
        )
        return int(revision.revision)

    started = time.monotonic()
    revision = asyncio.run(ensure())
    say(
        f"release {settings.release} in {settings.operator_namespace}: revision {revision} "
        f"({duration(time.monotonic() - started)})"
    )


def wait_operator(kube: Kube, settings: UpSettings) -> None:
    selector = f"app.kubernetes.io/instance={settings.release}"
    ns = settings.operator_namespace

    def check() -> tuple[bool, str]:
        deployments = kube.items(f"/apis/apps/v1/namespaces/{ns}/deployments", selector)
        if not deployments:
            return False, "no operator Deployment yet"
        dep = deployments[0]
        status, want = dep.get("status") or {}, dep["spec"].get("replicas", 1)
        done = status.get("observedGeneration", 0) >= dep["metadata"].get("generation", 0) and all(
            status.get(key, 0) == want
            for key in ("replicas", "updatedReplicas", "availableReplicas")
        )
        pods = kube.items(f"/api/v1/namespaces/{ns}/pods", selector)
        available = f"deployment/{dep['metadata']['name']}: {status.get('availableReplicas', 0)}"
        return done, f"{available}/{want} available; " + "; ".join(map(pod_state, pods))

    poll("operator", check, settings.operator_timeout_s, settings.poll_interval_s)


def pod_state(pod: Object) -> str:
    """One phrase for a pod: its phase, why a container waits, restarts, readiness."""
    status = pod.get("status") or {}
    words = [status.get("phase", "Unknown")]
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            words.append(cond.get("reason", "NotScheduled"))
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            words.append(waiting["reason"])
        if container.get("restartCount"):
            words.append(f"{container['restartCount']} restarts")
        if container.get("ready"):
            words.append("ready")
    return f"{pod['metadata']['name']} " + " ".join(words)


def poll(
    what: str,
    check: Callable[[], tuple[bool, str]],
    timeout: float,
    interval: float,
    finished: str = "ready",
) -> None:
    """Prints CHECK's description whenever it changes until CHECK says done; UpError on timeout."""
    started, last = time.monotonic(), ""
    last_print = started
    while True:
        done, description = check()
        if description != last or time.monotonic() - last_print >= HEARTBEAT_S:
            say(f"  {what}: {description}")
            last, last_print = description, time.monotonic()
        if done:
            say(f"  {what}: {finished} in {duration(time.monotonic() - started)}")
            return
        if time.monotonic() - started >= timeout:
            raise UpError(f"{what} not {finished} after {duration(timeout)}: {description}")
        time.sleep(interval)


# --- examples ------------------------------------------------------------------------------------


def small_node(kube: Kube, settings: UpSettings) -> tuple[bool, str]:
    if settings.profile != "auto":
        return settings.profile == "small", "GYMKUBE_UP_PROFILE"
    nodes = kube.items("/api/v1/nodes")
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


def retry_failed_runs(kube: Kube, settings: UpSettings, objects: list[Object]) -> None:
    """A finished TrainingRun is a record and never runs again: an example run that Failed last
    time is deleted, so this `up` runs it anew (a Succeeded one is kept and reported)."""
    for obj in objects:
        name = obj["metadata"]["name"]
        if obj["kind"] != "TrainingRun":
            continue
        found = kube.gymkube_object("TrainingRun", settings.namespace, name)
        if found is None or not condition_true(found, Run.FAILED):
            continue
        why = (condition(found, Run.FAILED) or {}).get("reason")
        say(f"  trainingrun/{name} failed last time ({why}): deleting it to run it again")
        out = kube.kubectl(
            "delete", "trainingrun", name, "-n", settings.namespace, "--wait=true", timeout=180
        )
        if out.returncode != 0:
            raise UpError(f"deleting trainingrun/{name} failed: {out.stderr.strip()}")


def apply_examples(kube: Kube, settings: UpSettings, objects: list[Object]) -> None:
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    out = kube.kubectl(
        "apply", "--server-side", "--force-conflicts", "--field-manager=gymkube-up",
        "-n", settings.namespace, "-f", "-", stdin=body,
    )  # fmt: skip
    if out.returncode != 0:
        raise UpError(f"applying the examples failed: {out.stderr.strip()}")
    for line in out.stdout.splitlines():
        say(f"  {line}")


def restart_pools(
    kube: Kube, settings: UpSettings, objects: list[Object], replaced: set[str]
) -> None:
    """Pods keep the image they started with when a rebuild reuses its tag: roll the example
    pools' servers and routers onto the new build (one pod at a time, draining as the operator
    does for any rollout)."""
    tag, ns = image_tag(), settings.namespace
    targets = []
    for obj in objects:
        if obj["kind"] != "EnvPool":
            continue
        name = obj["metadata"]["name"]
        if f"gymkube/envserver:{tag}" in replaced:
            targets.append(("statefulsets", f"statefulset/{name}", name))
        if f"gymkube/router:{tag}" in replaced:
            targets.append(("deployments", f"deployment/{name}-router", f"{name}-router"))
    for plural, ref, name in targets:
        if kube.get(f"/apis/apps/v1/namespaces/{ns}/{plural}/{name}") is None:
            continue  # a new pool starts on the new image anyway
        say(f"  {ref}: its image was rebuilt, restarting it")
        out = kube.kubectl("rollout", "restart", "-n", ns, ref)
        if out.returncode != 0:
            raise UpError(f"kubectl rollout restart {ref} failed: {out.stderr.strip()}")
        path = f"/apis/apps/v1/namespaces/{ns}/{plural}/{name}"

        def check(path: str = path) -> tuple[bool, str]:
            return rolled_out(kube.get(path))

        poll(ref, check, settings.pool_timeout_s, settings.poll_interval_s, "rolled out")


def rolled_out(workload: Object | None) -> tuple[bool, str]:
    """A StatefulSet or Deployment whose every replica runs the latest template and is ready."""
    if workload is None:
        return False, "gone"
    status, want = workload.get("status") or {}, workload["spec"].get("replicas", 1)
    updated, ready = status.get("updatedReplicas", 0), status.get("readyReplicas", 0)
    done = (
        status.get("observedGeneration", 0) >= workload["metadata"].get("generation", 0)
        and updated == ready == status.get("replicas", 0) == want
        and status.get("currentRevision") == status.get("updateRevision")  # StatefulSet only
    )
    return done, f"{updated}/{want} on the new template, {ready}/{want} ready"


@dataclass
class Watched:
    """One example object being waited for, with what was last printed about it."""

    kind: str
    name: str
    timeout: float
    started: float = field(default_factory=time.monotonic)
    last: str = ""
    ready_after: float | None = None
    obj: Object | None = None


def describe_pool(obj: Object | None) -> str:
    if obj is None:
        return "not found"
    status = obj.get("status") or {}
    parts = [f"{status.get('readyReplicas', 0)}/{obj['spec'].get('replicas', 0)} servers ready"]
    for kind in Pool:
        cond = condition(obj, kind)
        if cond and (kind == Pool.READY or cond.get("status") == "True"):
            parts.append(f"{kind}={cond.get('status')} {cond.get('reason', '')}".rstrip())
    return ", ".join(parts)


def trains_on_cpu(obj: Object) -> bool:
    return bool((obj.get("spec") or {}).get("device") == "cpu")


def describe_progress(progress: Object) -> str:
    """`step 1/2, reward 0.25, 42s a step, ETA 42s` from status.progress."""
    parts = [f"step {progress.get('step')}/{progress.get('totalSteps') or '?'}"]
    if progress.get("meanReward") is not None:
        parts.append(f"reward {progress['meanReward']:.3f}")
    if progress.get("stepSeconds") is not None:
        parts.append(f"{progress['stepSeconds']:.0f}s a step")
    if progress.get("etaSeconds") is not None:
        parts.append(f"ETA {duration(progress['etaSeconds'])}")
    return ", ".join(parts)


def describe_run(obj: Object | None) -> str:
    if obj is None:
        return "not found"
    status = obj.get("status") or {}
    parts = [f"phase {status.get('phase', 'Pending')}"]
    for kind in (Run.ENV_POOL_READY, Run.PREFLIGHT_PASSED, Run.FAILED):
        cond = condition(obj, kind)
        if cond and (kind != Run.FAILED or cond.get("status") == "True"):
            parts.append(f"{kind}={cond.get('status')} {cond.get('reason', '')}".rstrip())
    if status.get("training"):
        parts.append(f"{status['training']['kind'].lower()}/{status['training']['name']} created")
    if status.get("progress"):
        parts.append(describe_progress(status["progress"]))
    return ", ".join(parts)


def run_done(obj: Object) -> bool:
    """The run got as far as this cluster lets it: a CPU run Succeeded; a GPU run passed its
    preflight and made its training child (without a GPU node, that Job stays Pending)."""
    if trains_on_cpu(obj):
        return condition_true(obj, Run.SUCCEEDED)
    status = obj.get("status") or {}
    return condition_true(obj, Run.PREFLIGHT_PASSED) and bool(status.get("training"))


def pool_failed(obj: Object) -> str | None:
    """A pool that needs a human: waiting longer will not make it Ready."""
    degraded = condition(obj, Pool.DEGRADED)
    if degraded and degraded.get("status") == "True" and degraded.get("reason") in POOL_STUCK:
        return f"Degraded {degraded.get('reason')}: {degraded.get('message')}"
    return None


def run_failed(obj: Object) -> str | None:
    if condition_true(obj, Run.FAILED):
        failed = condition(obj, Run.FAILED) or {}
        return f"{failed.get('reason')}: {failed.get('message')}"
    preflight = condition(obj, Run.PREFLIGHT_PASSED)
    if preflight and preflight.get("status") == "False":
        return f"preflight failed: {preflight.get('message')}"
    return None


def wait_timeout(settings: UpSettings, obj: Object) -> float:
    if obj["kind"] == "EnvPool":
        return settings.pool_timeout_s
    training = settings.training_timeout_s if trains_on_cpu(obj) else 0.0
    return settings.pool_timeout_s + settings.preflight_timeout_s + training


def wait_examples(kube: Kube, settings: UpSettings, watched: list[Watched]) -> None:
    """Polls every example until each is ready, printing every change, in one loop."""
    last_heartbeat = time.monotonic()
    while True:
        pending = []
        for item in watched:
            if item.ready_after is not None:
                continue
            item.obj = kube.gymkube_object(item.kind, settings.namespace, item.name)
            pool = item.kind == "EnvPool"
            text = describe_pool(item.obj) if pool else describe_run(item.obj)
            if text != item.last:
                say(f"  {item.kind.lower()}/{item.name}: {text}")
                item.last = text
            obj = item.obj
            if obj is not None and current(obj):
                failure = pool_failed(obj) if pool else run_failed(obj)
                if failure:
                    raise UpError(f"{item.kind.lower()}/{item.name} failed: {failure}")
                if (pool and condition_true(obj, Pool.READY)) or (not pool and run_done(obj)):
                    item.ready_after = time.monotonic() - item.started
                    what = (
                        "Ready"
                        if pool
                        else "Succeeded"
                        if trains_on_cpu(obj)
                        else "preflight passed"
                    )
                    say(f"  {item.kind.lower()}/{item.name}: {what} {duration(item.ready_after)}")
                    continue
            if time.monotonic() - item.started >= item.timeout:
                raise UpError(
                    f"{item.kind.lower()}/{item.name} not ready after {duration(item.timeout)}: "
                    f"{text}"
                )
            pending.append(item)
        if not pending:
            return
        if time.monotonic() - last_heartbeat >= HEARTBEAT_S:
            waiting = ", ".join(
                f"{i.kind.lower()}/{i.name} ({duration(time.monotonic() - i.started)})"
                for i in pending
            )
            say(f"  ... waiting for {waiting}")
            last_heartbeat = time.monotonic()
        time.sleep(settings.poll_interval_s)


# --- summary and diagnostics ---------------------------------------------------------------------


def preflight_lines(summary: Object) -> Iterator[str]:
    endings = ", ".join(f"{k} {v}" for k, v in (summary.get("endings") or {}).items())
    yield (
        f"{summary.get('episodes')} {summary.get('policy', '')} episodes on {summary.get('env')}: "
        f"{endings or 'no endings'}; mean score {summary.get('mean_score', 0):.2f}, "
        f"mean steps {summary.get('mean_steps', 0):.1f}"
    )
    errors = summary.get("env_errors") or {}
    yield f"env errors: {json.dumps(errors) if errors else 'none'}"
    latency = summary.get("latency_ms") or {}
    parts = [f"{call} {lat['p50']:.0f}" for call, lat in latency.items() if lat.get("p50")]
    if parts:
        yield f"latency p50 (ms): {', '.join(parts)}"


def training_job_state(kube: Kube, settings: UpSettings, run: Object) -> str:
    child = (run.get("status") or {}).get("training") or {}
    if child.get("kind") != "Job":
        return f"{child.get('kind')}/{child.get('name')}"
    pods = kube.items(f"/api/v1/namespaces/{settings.namespace}/pods", f"job-name={child['name']}")
    states = "; ".join(pod_state(p) for p in pods) or "no pod yet"
    return f"job/{child['name']}: {states}"


def progress_records(log: str) -> list[Object]:
    """The trainer's progress lines, one per step, in the order it printed them."""
    records = []
    for line in log.splitlines():
        if line.startswith(PROGRESS_PREFIX):
            try:
                records.append(json.loads(line.removeprefix(PROGRESS_PREFIX)))
            except ValueError:
                continue
    return records


def metric_sum(metrics: str, name: str) -> float:
    """The sum of every sample of one Prometheus metric in a /metrics text (all label sets)."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[-1])
    return total


def pool_episodes(kube: Kube, settings: UpSettings, pool: str) -> str:
    """What the pool's env servers counted themselves, read through the API server's pod proxy."""
    ns = settings.namespace
    selector = f"gymkube.io/envpool={pool},app.kubernetes.io/component=envserver"
    episodes = scores = 0.0
    for pod in kube.items(f"/api/v1/namespaces/{ns}/pods", selector):
        name = pod["metadata"]["name"]
        metrics = kube.get_bytes(f"/api/v1/namespaces/{ns}/pods/{name}:8000/proxy/metrics") or b""
        text = metrics.decode()
        episodes += metric_sum(text, "gymkube_envserver_episodes_total")
        scores += metric_sum(text, "gymkube_envserver_episode_score_total")
    return f"{episodes:.0f} episodes, scores summing to {scores:g}"


def cpu_training_lines(kube: Kube, settings: UpSettings, run: Object) -> Iterator[str]:
    """Per-step rewards and times from the trainer's own log, the pool's counts, the checkpoint."""
    status = run.get("status") or {}
    child = status.get("training") or {}
    ns = settings.namespace
    pods = kube.items(f"/api/v1/namespaces/{ns}/pods", f"job-name={child.get('name')}")
    log = b""
    for pod in pods:
        log += (
            kube.get_bytes(
                f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}/log",
                {"container": "trainer"},
            )
            or b""
        )
    yield f"training job/{child.get('name')} on CPU: {describe_run(run)}"
    for record in progress_records(log.decode(errors="replace")):
        yield f"  {describe_progress(record)}"
    pool = (run.get("spec") or {}).get("envPoolRef", {}).get("name", "")
    counts = pool_episodes(kube, settings, pool)
    yield f"env pool {pool} served (its own counts, preflight included): {counts}"
    progress = status.get("progress") or {}
    where = progress.get("checkpoint") or "none written"
    volume = (run.get("spec") or {}).get("checkpoints")
    kept = "on the checkpoints volume" if volume else "in an emptyDir, gone with the pod"
    yield f"last checkpoint: {where} ({kept})"


def print_summary(
    kube: Kube, settings: UpSettings, flavour: str, watched: list[Watched], small: bool
) -> None:
    ns = settings.namespace
    print(f"\n[{clock()}] gymkube is up on the {flavour} cluster.\n")
    print(f"  export KUBECONFIG={kube.kubeconfig}")
    print(f"  kubectl get envpools,trainingruns -n {ns}\n")
    print(f"EnvPools (namespace {ns}{', small-node overrides' if small else ''}):")
    width = max((len(i.name) for i in watched if i.kind == "EnvPool"), default=12)
    for item in watched:
        if item.kind != "EnvPool" or item.obj is None:
            continue
        status = item.obj.get("status") or {}
        ready = condition(item.obj, Pool.READY) or {}
        print(
            f"  {item.name:<{width}} {'Ready' if ready.get('status') == 'True' else 'NotReady':<9}"
            f"{status.get('readyReplicas', 0)}/{item.obj['spec'].get('replicas')} servers  "
            f"capacity {status.get('capacity', 0):<4} {status.get('url', '(no URL yet)')}  "
            f"(apply → Ready {duration(item.ready_after or 0)})"
        )
    for item in watched:
        if item.kind != "TrainingRun" or item.obj is None:
            continue
        status = item.obj.get("status") or {}
        print(
            f"\nTrainingRun {item.name}: phase {status.get('phase')}, "
            f"pool {status.get('envPoolUrl')}"
        )
        preflight = status.get("preflight") or {}
        summary = preflight.get("summary")
        print(f"  preflight job/{preflight.get('jobName')}: passed={preflight.get('passed')}")
        for line in preflight_lines(summary) if summary else [str(preflight.get("message"))]:
            print(f"    {line}")
        if trains_on_cpu(item.obj):
            for line in cpu_training_lines(kube, settings, item.obj):
                print(f"  {line}")
            continue
        print(f"  training {training_job_state(kube, settings, item.obj)}")
        print("    (it asks for GPUs: without a GPU node it stays Pending, as expected)")
    print(
        f"\nFrom this machine: kubectl -n {ns} port-forward svc/frozen-lake 8000:8000, "
        "then http://127.0.0.1:8000/tasks\n`make down` removes it all."
    )


def diagnostics(kube: Kube, settings: UpSettings) -> str:
    ns, ops = settings.namespace, settings.operator_namespace
    selector = f"app.kubernetes.io/instance={settings.release}"
    sections = {
        f"gymkube objects in {ns}": ("get", "envpools,trainingruns", "-n", ns, "-o", "yaml"),
        f"workloads in {ns}": ("get", "statefulsets,deployments,jobs,pods", "-n", ns, "-o", "wide"),
        f"events in {ns}": ("get", "events", "-n", ns, "--sort-by=.lastTimestamp"),
        f"events in {ops}": ("get", "events", "-n", ops, "--sort-by=.lastTimestamp"),
        f"pods in {ns}": ("describe", "pods", "-n", ns),
        f"operator pods in {ops}": ("describe", "pods", "-n", ops),
        "operator logs": ("logs", "-n", ops, "-l", selector, "--all-containers", "--tail=200"),
        "nodes": ("describe", "nodes"),
    }  # fmt: skip
    parts = []
    for title, args in sections.items():
        try:
            out = kube.kubectl(*args, timeout=60)
            text = out.stdout + out.stderr
        except subprocess.TimeoutExpired:
            text = "(kubectl timed out)\n"
        parts.append(f"===== {title} =====\n{text}")
    return "\n".join(parts)


def dump_diagnostics(kube: Kube, settings: UpSettings) -> None:
    text = diagnostics(kube, settings)
    cache_dir().mkdir(parents=True, exist_ok=True)
    path = cache_dir() / "diagnostics.txt"
    path.write_text(text)
    print(text, file=sys.stderr)
    print(f"\n(diagnostics saved to {path})", file=sys.stderr)


# --- commands ------------------------------------------------------------------------------------


def up(settings: UpSettings) -> None:
    state = load_state()
    step("tools: kubectl and helm (hack/build-tools.sh, cached)")
    run_streamed([str(HACK / "build-tools.sh"), "kubectl", "helm"], what="tools")
    step("cluster")
    flavour, kubeconfig = cluster_up(settings, state)
    kube = Kube(kubeconfig)
    step("images (make images)")
    ids = build_images(settings, state)
    step(f"images into the {flavour} cluster")
    replaced = load_images(flavour, kube, state, ids)
    try:
        step("operator: the chart through pyhelm3")
        install_chart(kube, settings, ids[f"gymkube/operator:{image_tag()}"])
        wait_operator(kube, settings)
        step(f"examples into namespace {settings.namespace}")
        small, why = small_node(kube, settings)
        if small:
            say(f"small node ({why}): applying the examples with SMALL_NODE_OVERRIDES")
        objects = example_objects(small)
        retry_failed_runs(kube, settings, objects)
        apply_examples(kube, settings, objects)
        restart_pools(kube, settings, objects, replaced)
        watched = [
            Watched(obj["kind"], obj["metadata"]["name"], wait_timeout(settings, obj))
            for obj in objects
            if obj["kind"] in ("EnvPool", "TrainingRun")
        ]
        step("waiting for the pools to be Ready, the GPU run's preflight and the CPU run to end")
        wait_examples(kube, settings, watched)
    except UpError:
        dump_diagnostics(kube, settings)
        raise
    print_summary(kube, settings, flavour, watched, small)


def delete_examples(kube: Kube, settings: UpSettings) -> None:
    """Deletes the example run and pools and waits until they are gone. Their finalizers are the
    operator's; if it does not release them in time (it is not running), they are removed here,
    and the children go with their owner references."""
    if kube.get(f"/apis/{GROUP}/{VERSION}") is None:
        say("  the gymkube CRDs are not installed: no examples to delete")
        return
    names = [
        (obj["kind"], obj["metadata"]["name"]) for obj in reversed(example_objects(small=False))
    ]
    refs = [f"{kind.lower()}/{name}" for kind, name in names]
    out = kube.kubectl(
        "delete", "-n", settings.namespace, "--ignore-not-found", "--wait=false", *refs
    )
    for line in (out.stdout + out.stderr).splitlines():
        say(f"  {line}")
    if out.returncode != 0:
        raise UpError("deleting the examples failed (see above); `make down` again retries")

    def gone() -> tuple[bool, str]:
        left = [
            f"{kind.lower()}/{name}"
            for kind, name in names
            if kube.gymkube_object(kind, settings.namespace, name) is not None
        ]
        return not left, f"waiting for {', '.join(left)}" if left else "all deleted"

    try:
        poll("examples", gone, EXAMPLES_DELETE_TIMEOUT_S, settings.poll_interval_s, "deleted")
    except UpError:
        say("  the operator did not release them in time: removing their finalizers")
        for ref in refs:
            kube.kubectl(
                "patch", "-n", settings.namespace, ref, "--type=merge",
                "-p", '{"metadata": {"finalizers": null}}',
            )  # fmt: skip
        poll("examples", gone, 60, settings.poll_interval_s, "deleted")


def uninstall_chart(kube: Kube, settings: UpSettings) -> None:
    helm = HelmClient(executable=tool("helm"), kubeconfig=kube.kubeconfig)
    ns = settings.operator_namespace

    async def uninstall() -> bool:
        releases = await helm.list_releases(namespace=ns, all=True)
        if settings.release not in {release.name for release in releases}:
            return False
        await helm.uninstall_release(settings.release, namespace=ns, wait=True, timeout="3m")
        return True

    if asyncio.run(uninstall()):
        say(f"release {settings.release} uninstalled (the CRDs stay, as with any Helm chart)")
    else:
        say(f"release {settings.release} is not installed in {ns}")


def down(settings: UpSettings) -> None:
    state = load_state()
    kind = kind_settings()
    flavour = state.cluster or (
        "kind"
        if kind_cluster_exists(kind["name"])
        else "local"
        if local_cluster_running()
        else None
    )
    if flavour is None:
        say("no cluster from `make up` is running: nothing to do")
        return
    kubeconfig = Path(
        state.kubeconfig
        or (
            kind["kubeconfig"]
            if flavour == "kind"
            else quiet([str(HACK / "local-cluster.sh"), "kubeconfig"]).stdout.strip()
        )
    )
    kube = Kube(kubeconfig) if kubeconfig.is_file() else None
    if kube is not None and kube.reachable():
        step(f"examples out of namespace {settings.namespace}")
        delete_examples(kube, settings)
        step("operator: uninstalling the chart through pyhelm3")
        uninstall_chart(kube, settings)
    stop = settings.down_cluster == "always" or (
        settings.down_cluster == "auto" and state.started_cluster
    )
    step("cluster")
    if stop:
        script = (
            [str(HACK / "kind-down.sh")]
            if flavour == "kind"
            else [str(HACK / "local-cluster.sh"), "down"]
        )
        run_streamed(script, what=f"{flavour} cluster down")
    else:
        how = "make kind-down" if flavour == "kind" else "make cluster-down"
        say(f"the {flavour} cluster was running before `make up`: left running (`{how}` stops it)")
    # Docker keeps the images: only the record of the cluster goes.
    save_state(UpState(image_inputs=state.image_inputs, built_images=state.built_images))


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("up", "down"):
        print("usage: hack/up.py up|down", file=sys.stderr)
        return 2
    try:
        settings = UpSettings()
    except ValidationError as err:
        for problem in err.errors():
            name = "GYMKUBE_UP_" + "_".join(str(part) for part in problem["loc"]).upper()
            print(f"make {argv[0]}: {name}: {problem['msg']}", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        up(settings) if argv[0] == "up" else down(settings)
    except UpError as err:
        print(f"\nmake {argv[0]}: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\nmake {argv[0]}: interrupted; run it again to carry on", file=sys.stderr)
        return 130
    say(f"make {argv[0]}: done in {duration(time.monotonic() - started)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
