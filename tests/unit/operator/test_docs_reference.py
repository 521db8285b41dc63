"""The reference docs match the code: the spec tables in docs/envpool.md and docs/trainingrun.md
are the models the CRDs are generated from (every field documented, itself or by a parent row
that covers its children; no row for a field that is gone; every default stated is the model's),
and docs/troubleshooting.md has every condition reason the operator sets."""

import json
import re
import typing
from pathlib import Path
from typing import Any

import pytest
from gymkube_operator.envpool.models import EnvPoolSpec
from gymkube_operator.envpool.reasons import Degraded
from gymkube_operator.evalrun.reasons import Reason as EvalRunReason
from gymkube_operator.trainingrun.models import TrainingRunSpec
from gymkube_operator.trainingrun.reasons import Reason as TrainingRunReason
from pydantic import BaseModel

pytestmark = pytest.mark.unit

DOCS = Path(__file__).parents[3] / "docs"
# Defaults the table says in words because the model's is unset (the operator fills it in).
UNSET = ("required", "none", "operator's", "the env's own", "an emptyDir")


def _nested(annotation: Any) -> tuple[type[BaseModel], str] | None:
    """The model a field holds, and how its fields' paths go on: "." for one, "[]." for a list."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate, "."
        if typing.get_origin(candidate) is list:
            (item,) = typing.get_args(candidate)
            if isinstance(item, type) and issubclass(item, BaseModel):
                return item, "[]."
    return None


def _fields(model: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    """Every field path (camelCase, dotted) with its default; None for a required field."""
    found: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        path = prefix + (field.alias or name)
        found[path] = None if field.is_required() else field.get_default(call_default_factory=True)
        if (inner := _nested(field.annotation)) is not None:
            found.update(_fields(inner[0], path + inner[1]))
    return found


def _spec_table(doc: str) -> dict[str, str]:
    """The "## Spec" section's table: field -> its default column."""
    text = (DOCS / doc).read_text()
    section = text.split("\n## Spec\n", 1)[1].split("\n## ", 1)[0]
    rows = (line.split("|") for line in section.splitlines() if line.startswith("| `"))
    return {cells[1].strip().strip("`"): cells[2].strip() for cells in rows}


def _shown(default: Any) -> str | None:
    """A default as the table writes it; None where the model's default is a nested model."""
    if isinstance(default, BaseModel):
        return None
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, list | dict):
        return f"`{json.dumps(default)}`"
    return f"`{default}`"


@pytest.mark.parametrize(
    ("doc", "model"),
    [("envpool.md", EnvPoolSpec), ("trainingrun.md", TrainingRunSpec)],
    ids=["EnvPool", "TrainingRun"],
)
def test_the_spec_table_is_the_models(doc: str, model: type[BaseModel]) -> None:
    table, fields = _spec_table(doc), _fields(model)
    assert sorted(set(table) - set(fields)) == [], f"{doc} documents fields the spec lacks"

    def covered(path: str) -> bool:
        # Itself, a parent row that covers it, or rows for its own fields.
        parts = path.replace("[].", ".").split(".")
        parents = (".".join(parts[:n]) for n in range(1, len(parts) + 1))
        return any(p in table for p in parents) or any(k.startswith(path + ".") for k in table)

    missing = [path for path in fields if not covered(path)]
    assert missing == [], f"{doc} leaves these fields undocumented"
    for path, said in table.items():
        default = fields[path]
        if default is None or (shown := _shown(default)) is None:
            assert said.startswith(UNSET) or said.startswith("`"), (path, said)
            continue
        assert said.startswith(shown), (doc, path, said, shown)


def test_every_reason_gymkube_sets_is_on_the_troubleshooting_page() -> None:
    # Written `Reason` or `Condition: Reason`, outside the code blocks.
    text = re.sub(r"```.*?```", "", (DOCS / "troubleshooting.md").read_text(), flags=re.S)
    spans = re.findall(r"`([^`]+)`", text)
    named = {span.rsplit(": ", 1)[-1] for span in spans}
    reasons = [*Degraded, *TrainingRunReason, *EvalRunReason]
    assert [r.value for r in reasons if r.value not in named] == []
