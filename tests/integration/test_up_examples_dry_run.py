"""The objects `make up` applies pass the real API server's validation (the CRDs' schemas and CEL
rules), as written and with the small-node overrides, in one server-side dry run each."""

import json
import sys
from pathlib import Path

import pytest
from controlplane import ControlPlane

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "unit" / "quickstart"))
from up_module import up  # noqa: E402 (hack/up.py, imported by path)


@pytest.fixture(scope="module")
def crds(kube: ControlPlane) -> None:
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(up.CHART / "crds"))
    kube.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s",
        "crd/envpools.gymkube.io", "crd/trainingruns.gymkube.io",
    )  # fmt: skip


@pytest.mark.parametrize("small", [False, True], ids=["as-written", "small-node"])
def test_the_examples_make_up_applies_pass_a_server_side_dry_run(
    kube: ControlPlane, crds: None, namespace: str, small: bool
) -> None:
    objects = up.example_objects(small)
    result = kube.kubectl(
        "apply", "--server-side", "--dry-run=server", "--field-manager=gymkube-up",
        "-n", namespace, "-f", "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}),
    )  # fmt: skip
    applied = result.stdout.count("serverside-applied (server dry run)")
    assert applied == len(objects) == 5, result.stdout
