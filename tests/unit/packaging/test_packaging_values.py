"""Every chart value is documented (helm-docs `# --`) and declared in the strict schema."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.unit

CHART = Path(__file__).resolve().parents[3] / "charts" / "gymkube"
VALUES_TEXT = (CHART / "values.yaml").read_text()
VALUES = yaml.safe_load(VALUES_TEXT)
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z][A-Za-z0-9]*):")


def leaves(node: dict[str, Any], schema: dict[str, Any] = SCHEMA, prefix: str = "") -> set[str]:
    """Dotted paths of the values helm-docs documents: each key down to where the schema stops
    declaring properties (free-form maps such as labels or security contexts are one value)."""
    paths: set[str] = set()
    for key, value in node.items():
        path = f"{prefix}{key}"
        declared = schema.get("properties", {}).get(key, {})
        if isinstance(value, dict) and value and "properties" in declared:
            paths |= leaves(value, declared, f"{path}.")
        else:
            paths.add(path)
    return paths


def documented() -> set[str]:
    """Dotted paths of the keys whose comment block above starts with helm-docs' `# --`."""
    paths: set[str] = set()
    stack: list[tuple[int, str]] = []
    comment: list[str] = []
    for line in VALUES_TEXT.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment.append(stripped)
            continue
        match = KEY_LINE.match(line)
        if match is None:
            comment = []
            continue
        indent = len(match["indent"])
        stack = [(level, key) for level, key in stack if level < indent]
        stack.append((indent, match["key"]))
        if any(text.startswith("# --") for text in comment):
            paths.add(".".join(key for _, key in stack))
        comment = []
    return paths


def schema_paths(schema: dict[str, Any], prefix: str = "") -> set[str]:
    paths: set[str] = set()
    for key, sub in schema.get("properties", {}).items():
        paths.add(f"{prefix}{key}")
        paths |= schema_paths(sub, f"{prefix}{key}.")
    return paths


def test_every_value_has_a_helm_docs_comment() -> None:
    assert leaves(VALUES) - documented() == set()


def test_every_value_is_declared_in_the_schema() -> None:
    assert leaves(VALUES) - schema_paths(SCHEMA) == set()


def test_schema_rejects_unknown_keys_in_every_object() -> None:
    def loose(schema: dict[str, Any], path: str) -> list[str]:
        found = []
        if "properties" in schema and schema.get("additionalProperties") is not False:
            found.append(path or "<top>")
        for key, sub in schema.get("properties", {}).items():
            found += loose(sub, f"{path}.{key}" if path else key)
        return found

    assert loose(SCHEMA, "") == []


@pytest.mark.parametrize("scenario", sorted((CHART / "ci").glob("*-values.yaml")), ids=str)
def test_ci_scenarios_only_use_declared_values(scenario: Path) -> None:
    values = yaml.safe_load(scenario.read_text()) or {}
    assert leaves(values) - schema_paths(SCHEMA) == set()
