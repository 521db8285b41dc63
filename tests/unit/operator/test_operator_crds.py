"""The CRD YAML is generated from the models, structural, and identical in every shipped copy."""

from typing import Any

import pytest
import yaml
from gymkube_operator.crds import render
from gymkube_operator.crds.catalog import RESOURCES, package_file
from gymkube_operator.envpool.resource import ENVPOOL

pytestmark = pytest.mark.unit

FORBIDDEN = {"$ref", "$defs", "anyOf", "allOf", "oneOf", "title", "definitions"}


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        found.append((path, node))
        for key, value in node.get("properties", {}).items():
            found += _walk(value, f"{path}.{key}")
        if "items" in node:
            found += _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            found += _walk(node["additionalProperties"], f"{path}{{}}")
    return found


@pytest.mark.parametrize("resource", RESOURCES, ids=lambda r: r.name)
def test_schema_is_structural(resource: Any) -> None:
    schema = render(resource)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        forbidden = FORBIDDEN - ({"anyOf"} if node.get("x-kubernetes-int-or-string") else set())
        assert not forbidden & node.keys(), f"{path} uses {forbidden & node.keys()}"
        typed = "type" in node or node.get("x-kubernetes-int-or-string")
        assert typed, f"{path} has no type"
        assert node.get("default", 0) is not None, f"{path} defaults to null"


def test_package_copy_is_the_rendered_crd() -> None:
    on_disk = yaml.safe_load(package_file(ENVPOOL).read_text())
    assert on_disk == render(ENVPOOL)


def test_envpool_crd_has_the_kubectl_surface() -> None:
    crd = render(ENVPOOL)
    version = crd["spec"]["versions"][0]
    assert crd["metadata"]["name"] == "envpools.gymkube.io"
    assert crd["spec"]["names"]["shortNames"] == ["envp"]
    assert version["name"] == "v1alpha1"
    columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert columns == ["Ready", "Sessions", "Capacity", "Health", "URL", "Age"]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert version["subresources"]["status"] == {}


def test_spec_defaults_fill_in_nested_objects() -> None:
    spec = render(ENVPOOL)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    fields = spec["spec"]["properties"]
    # An omitted watchdog gets every field's default, so its CEL rules can read them all.
    assert fields["watchdog"]["default"]["probePeriodSeconds"] == 5
    assert fields["watchdog"]["default"]["probeTimeoutSeconds"] == 2
    assert fields["router"]["default"] == {"replicas": 1, "resources": {}}
    assert "default" not in spec["status"]["properties"]["replicas"]
    conditions = spec["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
