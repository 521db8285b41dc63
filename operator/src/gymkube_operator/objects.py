"""Helpers for building Kubernetes objects as plain dicts: owner references, labels, merges."""

import copy
import dataclasses
from typing import Any

from gymkube_operator.kinds import API_VERSION

Object = dict[str, Any]

# Lists of these pod-spec fields hold named items; an override replaces or adds items by name.
NAMED_LISTS = frozenset(
    {"containers", "initContainers", "volumes", "env", "volumeMounts", "ports", "envFrom"}
)

# The restricted Pod Security Standard, for every container gymkube runs.
RESTRICTED_CONTAINER: Object = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
RESTRICTED_POD: Object = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "runAsGroup": 10001,
    "fsGroup": 10001,
    "seccompProfile": {"type": "RuntimeDefault"},
}


@dataclasses.dataclass(frozen=True)
class Owner:
    """The custom resource that owns the children being built."""

    kind: str
    name: str
    namespace: str
    uid: str

    def reference(self) -> Object:
        return {
            "apiVersion": API_VERSION,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def metadata(self, name: str, labels: dict[str, str]) -> Object:
        return {
            "name": name,
            "namespace": self.namespace,
            "labels": labels,
            "ownerReferences": [self.reference()],
        }


def merge(base: Any, override: Any) -> Any:
    """Deep-merge override into base: maps recursively, named lists by name, the rest replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = copy.deepcopy(base)
        for key, value in override.items():
            if key in merged and key in NAMED_LISTS:
                merged[key] = _merge_named(merged[key], value)
            elif key in merged:
                merged[key] = merge(merged[key], value)
            else:
                merged[key] = copy.deepcopy(value)
        return merged
    return copy.deepcopy(override)


def _merge_named(base: list[Any], override: list[Any]) -> list[Any]:
    merged = copy.deepcopy(base)
    names = [item.get("name") if isinstance(item, dict) else None for item in merged]
    for item in override:
        name = item.get("name") if isinstance(item, dict) else None
        if name is not None and name in names:
            index = names.index(name)
            merged[index] = merge(merged[index], item)
        else:
            merged.append(copy.deepcopy(item))
            names.append(name)
    return merged
