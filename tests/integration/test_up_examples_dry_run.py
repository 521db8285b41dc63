"""The objects `make up` applies pass the real API server's validation (the CRDs' schemas and CEL
rules), as written and with the small-node overrides, in one server-side dry run each."""

import json

import pytest
from controlplane import ControlPlane
from gymkube_dev import CHART
from gymkube_dev.examples import example_objects
from operator_support import wait_for_crds

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def crds(kube: ControlPlane) -> None:
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    wait_for_crds(kube)


@pytest.mark.parametrize("small", [False, True], ids=["as-written", "small-node"])
def test_the_examples_make_up_applies_pass_a_server_side_dry_run(
    kube: ControlPlane, crds: None, namespace: str, small: bool
) -> None:
    objects = example_objects(small)
    result = kube.kubectl(
        "apply", "--server-side", "--dry-run=server", "--field-manager=gymkube-up",
        "-n", namespace, "-f", "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}),
    )  # fmt: skip
    applied = result.stdout.count("serverside-applied (server dry run)")
    assert applied == len(objects) == 5, result.stdout
