"""The Dockerfiles lint clean, run as non-root and build from what hack/build-images.sh makes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[3]
# gymkube's images, and the bring-your-own OpenEnv server example built beside them.
DOCKERFILES = sorted(
    [*(REPO_ROOT / "images").glob("*/*Dockerfile"), *(REPO_ROOT / "examples").glob("*/Dockerfile")]
)
HADOLINT = Path(sys.executable).parent / "hadolint"
BUILD_SCRIPT = (REPO_ROOT / "hack" / "build-images.sh").read_text()
# `[image]="dockerfile target wheel-set base-flavours"` lines of the build script's recipe table.
RECIPES = re.findall(r'^\t\[([a-z-]+)\]="(\S+) (\S+) (\S+) \S+"$', BUILD_SCRIPT, re.MULTILINE)


def stages(dockerfile: Path) -> dict[str, list[str]]:
    """Stage name -> its instructions (continuation lines joined)."""
    text = re.sub(r"\\\n\s*", " ", dockerfile.read_text())
    result: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        if line.startswith("FROM "):
            current = result.setdefault(line.split()[-1], [])
        elif line and not line.startswith("#"):
            current.append(line)
    return result


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_finds_nothing(dockerfile: Path) -> None:
    done = subprocess.run(
        [str(HADOLINT), "--failure-threshold", "style", str(dockerfile)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_images_take_a_base_image_and_run_as_the_non_root_uid(dockerfile: Path) -> None:
    # BASE_IMAGE, or <FLAVOUR>_BASE_IMAGE where the image needs a richer base (hack/base-image.sh).
    assert re.search(r"^ARG (\w+_)?BASE_IMAGE=", dockerfile.read_text(), re.MULTILINE)
    runtime = [name for name in stages(dockerfile) if not name.endswith("venv")]
    assert runtime
    for name in runtime:
        users = [line for line in stages(dockerfile)[name] if line.startswith("USER ")]
        # Numeric, so the kubelet can enforce runAsNonRoot without reading /etc/passwd.
        assert users == ["USER 10001:10001"], (name, users)


def test_every_image_in_the_build_script_has_its_target_and_wheels() -> None:
    assert {image for image, *_ in RECIPES} == {
        "envserver", "router", "operator", "preflight", "trainer", "trainer-cpu", "openenv-sudoku",
    }  # fmt: skip
    locked = re.findall(r"^declare -A LOCKED=\(\[([a-z-]+)\]=", BUILD_SCRIPT, re.MULTILINE)
    served = re.findall(r"^declare -A SERVED=\(\[([a-z-]+)\]=", BUILD_SCRIPT, re.MULTILINE)
    assert served == ["trainer"]
    ignored = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    for image, dockerfile, target, wheel_set in RECIPES:
        built = stages(REPO_ROOT / dockerfile)
        assert target in built, (image, target)
        if wheel_set in locked + served:
            # Served to the build, not copied: the wheels stay out of the context and the layers.
            text = (REPO_ROOT / dockerfile).read_text()
            where = "${WHEELS_URL}/locked/" if wheel_set in locked else "${WHEELS_URL}/"
            assert f'--find-links "{where}"' in text, image
            assert "--no-index" in text, image
            assert wheel_set in locked or f"out/wheels/{wheel_set}/" in ignored, image
            continue
        wanted_from = {f"out/wheels/{wheel_set}"}
        copied = {
            line.split()[1]
            for stage in built.values()
            for line in stage
            if line.startswith("COPY ") and "--from" not in line
        }
        assert wanted_from <= copied, (image, copied)


def test_build_context_holds_only_the_wheels_and_the_example_server() -> None:
    ignored = [
        line
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert ignored == [
        "*",
        "!out/wheels/",
        "out/wheels/trainer/",  # the GPU trainer's, served to its build instead
        "!examples/openenv-sudoku/sudoku_server.py",
    ]
    admitted = tuple(line[1:] for line in ignored if line.startswith("!"))
    for dockerfile in DOCKERFILES:
        for stage in stages(dockerfile).values():
            for line in stage:
                if line.startswith("COPY ") and "--from" not in line:
                    assert line.split()[1].startswith(admitted), (dockerfile, line)
