"""CustomResourceDefinitions generated from the pydantic models: the one source of the CRD YAML.

`python -m gymkube_operator.crds write` (`make manifests`) renders every CRD into this package and
copies it into the Helm chart and the kustomize base; `check` reports copies that drifted.
"""

import copy
import dataclasses
from typing import Any

import yaml
from pydantic import BaseModel

from gymkube_operator.kinds import GROUP, VERSION


@dataclasses.dataclass(frozen=True)
class PrinterColumn:
    name: str
    type: str
    json_path: str
    description: str
    priority: int = 0


@dataclasses.dataclass(frozen=True)
class CustomResource:
    """Everything a CRD says besides the schema, which comes from the spec and status models."""

    kind: str
    plural: str
    short_names: tuple[str, ...]
    spec: type[BaseModel]
    status: type[BaseModel]
    columns: tuple[PrinterColumn, ...]
    description: str
    # Rules on the whole object (they may read metadata.name).
    rules: tuple[tuple[str, str], ...] = ()
    # (specReplicasPath, statusReplicasPath, labelSelectorPath) for the scale subresource.
    scale: tuple[str, str, str] | None = None

    @property
    def name(self) -> str:
        return f"{self.plural}.{GROUP}"

    @property
    def file_name(self) -> str:
        return f"{GROUP}_{self.plural}.yaml"


def _inline_refs(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_inline_refs(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = _inline_refs(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
        extra = {k: v for k, v in node.items() if k != "$ref"}
        return {**target, **_inline_refs(extra, defs)}
    return {k: _inline_refs(v, defs) for k, v in node.items()}


def _defaultable(node: dict[str, Any]) -> bool:
    return node.get("type") == "object" and "properties" in node and not node.get("required")


def _default_of(node: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, child in node["properties"].items():
        if "default" in child:
            values[key] = child["default"]
        elif _defaultable(child):
            values[key] = _default_of(child)
    return values


def _structural(node: Any, *, defaults: bool) -> Any:
    """Turn pydantic's JSON schema into a Kubernetes structural schema."""
    if isinstance(node, list):
        return [_structural(item, defaults=defaults) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    # Optional[X] is anyOf [X, null]; Kubernetes expresses "optional" by leaving the key out.
    # int-or-string keeps its anyOf [integer, string]: that form is structural.
    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        branches = [b for b in node.pop("anyOf") if b.get("type") != "null"]
        if len(branches) != 1:
            raise ValueError(f"unions are not structural: {branches}")
        node = {**branches[0], **node}
    node.pop("title", None)
    # JSON Schema's exclusiveMinimum: N (pydantic's gt=N) is OpenAPI 3.0's minimum: N plus
    # exclusiveMinimum: true; likewise for the maximum.
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if not isinstance(node.get(exclusive, True), bool):
            node[bound] = node[exclusive]
            node[exclusive] = True
    if node.get("additionalProperties") is False:
        node.pop("additionalProperties")
    if not defaults or node.get("default", 0) is None:
        node.pop("default", None)
    out = {k: _structural(v, defaults=defaults) for k, v in node.items() if k != "properties"}
    if "properties" in node:
        properties = {}
        required = set(node.get("required", []))
        for key, child in node["properties"].items():
            # A required field is never omitted; one whose model default is None stays unset
            # when omitted (its absence means something, e.g. "take the TrainingRun's").
            defaulted = key not in required and child.get("default", 0) is not None
            child = _structural(child, defaults=defaults)
            # A nested object whose fields all have defaults defaults to those values, so an
            # omitted object is filled in (and validation rules on it see every field).
            if defaults and defaulted and _defaultable(child) and "default" not in child:
                child["default"] = _default_of(child)
            properties[key] = child
        out["properties"] = properties
    return out


def _object_schema(model: type[BaseModel], *, defaults: bool) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True)
    defs = raw.pop("$defs", {})
    schema: dict[str, Any] = _structural(_inline_refs(raw, defs), defaults=defaults)
    return schema


def render(resource: CustomResource) -> dict[str, Any]:
    spec = _object_schema(resource.spec, defaults=True)
    status = _object_schema(resource.status, defaults=False)
    root: dict[str, Any] = {
        "type": "object",
        "description": resource.description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    if resource.rules:
        root["x-kubernetes-validations"] = [{"rule": r, "message": m} for r, m in resource.rules]
    subresources: dict[str, Any] = {"status": {}}
    if resource.scale:
        spec_path, status_path, selector_path = resource.scale
        subresources["scale"] = {
            "specReplicasPath": spec_path,
            "statusReplicasPath": status_path,
            "labelSelectorPath": selector_path,
        }
    columns = [
        {
            "name": c.name,
            "type": c.type,
            "jsonPath": c.json_path,
            "description": c.description,
            **({"priority": c.priority} if c.priority else {}),
        }
        for c in resource.columns
    ]
    columns.append({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"})
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": resource.name},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": resource.kind,
                "listKind": f"{resource.kind}List",
                "plural": resource.plural,
                "singular": resource.kind.lower(),
                "shortNames": list(resource.short_names),
                "categories": ["gymkube"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": copy.deepcopy(root)},
                    "subresources": subresources,
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


HEADER = "# Generated from gymkube_operator's pydantic models by `make manifests`. Do not edit.\n"


def render_yaml(resource: CustomResource) -> str:
    return HEADER + yaml.safe_dump(render(resource), sort_keys=False, width=100)
