"""hack/build-tools.sh's lock: one builder at a time per cache, and a caller whose tools are all
built does not wait behind another's build (the e2e readying builds Cilium and the controllers
beside the kind node image, whose own tools are already there)."""

import fcntl
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[3]
BUILD_TOOLS = REPO_ROOT / "hack" / "build-tools.sh"
KUSTOMIZE_VERSION = next(
    line.split("=", 1)[1]
    for line in (REPO_ROOT / "hack" / "versions.env").read_text().splitlines()
    if line.startswith("KUSTOMIZE_VERSION=")
)


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[Path]:
    """A tool cache whose build lock another builder holds."""
    with (tmp_path / "build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield tmp_path


def _build_tools(cache: Path, *tools: str) -> subprocess.Popen[str]:
    env = {**os.environ, "GYMKUBE_CACHE": str(cache), "GYMKUBE_BIN_DIR": str(cache / "bin")}
    return subprocess.Popen(
        ["bash", str(BUILD_TOOLS), *tools],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _stand_in_kustomize(cache: Path, version: str) -> None:
    kustomize = cache / "bin" / "kustomize"
    kustomize.parent.mkdir(parents=True)
    kustomize.write_text(f"#!/bin/sh\necho {version}\n")
    kustomize.chmod(0o755)


def test_tools_already_built_need_no_lock(cache: Path) -> None:
    _stand_in_kustomize(cache, KUSTOMIZE_VERSION)
    _, err = _build_tools(cache, "kustomize").communicate(timeout=10)
    assert "up to date" in err


def test_a_stale_tool_waits_for_the_builder_that_holds_the_lock(cache: Path) -> None:
    _stand_in_kustomize(cache, "v0.0.1")
    builder = _build_tools(cache, "kustomize")
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            builder.wait(timeout=3)
    finally:
        os.killpg(builder.pid, signal.SIGKILL)
        builder.communicate()
