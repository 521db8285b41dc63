"""Where the pinned Kubernetes tools are: hack/tool-path.sh's directory (hack/lib/tools.sh lays
it out from hack/versions.env), else PATH."""

import shutil
import subprocess
from functools import cache
from pathlib import Path

from gymkube_dev import HACK
from gymkube_dev.errors import StepError


@cache
def tool_dir() -> Path | None:
    """The directory hack/build-tools.sh builds into, when the script answers."""
    out = subprocess.run(
        ["bash", str(HACK / "tool-path.sh")], capture_output=True, text=True, check=False
    )
    return Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None


def find_tool(name: str) -> str:
    """A pinned tool (kubectl, helm, ...), else the one on PATH (a user's CI)."""
    pinned = tool_dir()
    if pinned is not None and (pinned / name).is_file():
        return str(pinned / name)
    found = shutil.which(name)
    if found is None:
        raise StepError(f"{name} not found: `hack/build-tools.sh {name}` builds it")
    return found
