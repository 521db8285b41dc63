"""`make up`'s images: build them (`make images`) only when something that goes into them
changed, and load into the cluster only what it lacks."""

import hashlib
from collections.abc import Sequence

from gymkube_dev import REPO
from gymkube_dev.clusters import docker_answers, load_images
from gymkube_dev.console import quiet, run_streamed, say
from gymkube_dev.errors import StepError
from gymkube_dev.images import image_refs
from gymkube_dev.kube import Kube
from gymkube_dev.settings import ClusterKind, UpSettings, UpState, save_state

IMAGE_INPUTS = (
    "images",
    "operator",
    "agentloop",
    "requirements",
    "hack/build-images.sh",
    "hack/base-image.sh",
    "examples/openenv-sudoku",
    ".dockerignore",
    "charts/gymkube/Chart.yaml",
)
"""What goes into the images: a change here means `make images` must run again."""


def image_inputs() -> dict[str, str]:
    """Every file (tracked or not, unless ignored) that goes into the images, with its hash."""
    listed = quiet(["git", "ls-files", "-co", "--exclude-standard", "-z", "--", *IMAGE_INPUTS])
    if listed.returncode != 0:
        raise StepError(f"git ls-files failed: {listed.stderr.strip()}")
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
    """Image ref -> Docker image id, built now or already current."""
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
        raise StepError(f"`make images` did not produce {', '.join(missing)}")
    state.image_inputs, state.built_images = inputs, built
    save_state(state)
    return built


def node_image_names(kube: Kube) -> set[str]:
    names: set[str] = set()
    for node in kube.list_objects("/api/v1/nodes"):
        for image in (node.get("status") or {}).get("images") or []:
            names.update(image.get("names") or [])
    return names


def load_missing_images(
    flavour: ClusterKind, kube: Kube, state: UpState, ids: dict[str, str]
) -> set[str]:
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
    load_images(flavour, stale)
    replaced = {ref for ref in stale if state.loaded_images.get(ref) not in (None, ids[ref])}
    state.loaded_images.update({ref: ids[ref] for ref in stale})
    save_state(state)
    return replaced
