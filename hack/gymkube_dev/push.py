"""`make push REGISTRY=host[:port][/prefix]`: tag and push the images built here to a registry,
write the chart values that use them, and print the commands that install from them.

    python -m gymkube_dev.push REGISTRY [IMAGE...]

With no IMAGE, every image `make images` builds and, when it was built
(`hack/build-images.sh trainer`), the GPU trainer. The values file is out/push/values.yaml.
"""

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from gymkube_dev import REPO
from gymkube_dev.images import IMAGES, PREFIX, app_version, image_ref

# Where the chart reads each image's repository; the OpenEnv Sudoku example names its own image.
CHART_IMAGE_VALUES: dict[str, tuple[str, ...]] = {
    "operator": ("image",),
    "envserver": ("defaultImages", "envServer"),
    "router": ("defaultImages", "router"),
    "preflight": ("defaultImages", "preflight"),
    "trainer": ("defaultImages", "trainer"),
    "trainer-cpu": ("defaultImages", "trainerCpu"),
}
GPU_TRAINER = "trainer"
VALUES_FILE = REPO / "out" / "push" / "values.yaml"
# host[:port], then optional path segments: what `docker push` takes before `gymkube/<name>`.
REGISTRY = re.compile(
    r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?(/[a-z0-9]+([._-][a-z0-9]+)*)*$"
)


class PushError(Exception):
    """A registry or image the push cannot use, in words for the user."""


def check_registry(registry: str) -> str:
    registry = registry.strip().rstrip("/")
    if "://" in registry or not REGISTRY.match(registry):
        raise PushError(
            f"REGISTRY={registry!r} is not host[:port][/prefix] "
            "(e.g. registry.example.com/team or localhost:5000)"
        )
    return registry


def pushed_ref(registry: str, name: str, tag: str | None = None) -> str:
    return image_ref(name, tag, prefix=f"{registry}/{PREFIX}")


def pushed_values(registry: str, names: list[str]) -> dict[str, Any]:
    """Chart values that take the pushed images: each one's repository (tags stay the chart's)."""
    values: dict[str, Any] = {}
    for name in names:
        if name not in CHART_IMAGE_VALUES:
            continue
        *parents, leaf = CHART_IMAGE_VALUES[name]
        node = values
        for key in parents:
            node = node.setdefault(key, {})
        node.setdefault(leaf, {})["repository"] = f"{registry}/{PREFIX}/{name}"
    return values


def install_commands(values_file: Path) -> list[str]:
    relative = values_file.relative_to(REPO)
    return [
        "B=$(hack/tool-path.sh)",
        "$B/helm install gymkube charts/gymkube -n gymkube-system --create-namespace "
        f"-f {relative}",
    ]


def _local(ref: str) -> bool:
    found = subprocess.run(["docker", "image", "inspect", ref], capture_output=True, check=False)
    return found.returncode == 0


def _docker(*args: str) -> None:
    if subprocess.run(["docker", *args], check=False).returncode != 0:
        raise PushError(f"`docker {' '.join(args)}` failed (its output is above)")


def push(registry: str, names: list[str]) -> list[str]:
    """Tags and pushes each image; returns the names pushed."""
    missing = [image_ref(name) for name in names if not _local(image_ref(name))]
    if missing:
        raise PushError(f"not built here: {', '.join(missing)}; run `make images` first")
    for name in names:
        target = pushed_ref(registry, name)
        print(f"push: {image_ref(name)} -> {target}", flush=True)
        _docker("tag", image_ref(name), target)
        _docker("push", target)
    return names


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: make push REGISTRY=host[:port][/prefix] [IMAGES='name ...']", file=sys.stderr)
        return 2
    try:
        registry = check_registry(argv[0])
        names = argv[1:] or [*IMAGES, *([GPU_TRAINER] if _local(image_ref(GPU_TRAINER)) else [])]
        unknown = sorted(set(names) - {*IMAGES, GPU_TRAINER})
        if unknown:
            raise PushError(
                f"unknown image {', '.join(unknown)}; the images are {', '.join(IMAGES)}, trainer"
            )
        pushed = push(registry, names)
    except PushError as err:
        print(f"make push: error: {err}", file=sys.stderr)
        return 1
    VALUES_FILE.parent.mkdir(parents=True, exist_ok=True)
    VALUES_FILE.write_text(yaml.safe_dump(pushed_values(registry, pushed), sort_keys=False))
    where = VALUES_FILE.relative_to(REPO)
    print(f"\npushed {len(pushed)} images to {registry}/{PREFIX} (tag {app_version()})")
    print(f"their chart values: {where}")
    print("install the chart with them:\n")
    print("\n".join(f"  {line}" for line in install_commands(VALUES_FILE)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
