"""Every generated file matches its source: the CRD copies (operator package, chart, kustomize)
the pydantic models, and the kustomize base's RBAC and Deployment the Helm chart. `make manifests`
regenerates them all; this is the one drift check."""

import subprocess
import sys
from pathlib import Path

import pytest
from gymkube_operator.crds.catalog import drifted

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_every_generated_file_matches_its_source() -> None:
    stale = [str(path.relative_to(REPO_ROOT)) for path in drifted(REPO_ROOT)]
    # The kustomize base is rendered with helm, one of the pinned tools (`make tools`).
    rendered = subprocess.run(
        [sys.executable, "hack/render_kustomize_base.py", "--check"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=120,
    )  # fmt: skip
    if rendered.returncode != 0:
        stale.append(rendered.stdout + rendered.stderr)
    assert not stale, f"run `make manifests`; out of date: {stale}"
