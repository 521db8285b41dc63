"""metav1.Condition in Python: the model for CRD schemas and apimachinery's set-condition rule."""

import datetime
import re
from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, WithJsonSchema

from gymkube_operator.kinds import CamelModel

REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
MAX_REASON = 1024
RFC3339 = "%Y-%m-%dT%H:%M:%SZ"
"""The timestamps the API server writes (creationTimestamp, lastTransitionTime): UTC, seconds."""
MAX_MESSAGE = 32768
# A component's own words quoted in a condition message: one line of at most this many characters.
MAX_LINE = 300

Timestamp = Annotated[str, WithJsonSchema({"type": "string", "format": "date-time"})]


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(CamelModel):
    """One entry of status.conditions, shaped like metav1.Condition."""

    type: str = Field(max_length=316, description="CamelCase condition type, e.g. Ready.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(
        min_length=1, max_length=MAX_REASON, pattern=REASON_PATTERN, description="CamelCase cause."
    )
    message: str = Field("", max_length=MAX_MESSAGE, description="Human-readable detail.")
    observed_generation: int = Field(0, ge=0, description="metadata.generation this is based on.")
    last_transition_time: Timestamp = Field(description="When status last changed.")


# What the CRD schema of every resource's status.conditions looks like.
CONDITIONS_SCHEMA_EXTRA: dict[str, Any] = {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}


def now_rfc3339(now: datetime.datetime | None = None) -> str:
    moment = now or datetime.datetime.now(datetime.UTC)
    return moment.astimezone(datetime.UTC).strftime(RFC3339)


def parse_rfc3339(timestamp: str) -> datetime.datetime:
    return datetime.datetime.strptime(timestamp, RFC3339).replace(tzinfo=datetime.UTC)


def is_reason(text: str) -> bool:
    """Whether text may be a condition's reason (CamelCase, as the API server validates it)."""
    return len(text) <= MAX_REASON and re.match(REASON_PATTERN, text) is not None


def set_condition(
    conditions: list[Condition],
    *,
    type: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    generation: int,
    now: str,
) -> list[Condition]:
    """Return the list with one condition set; lastTransitionTime moves only when status changes."""
    previous = find_condition(conditions, type)
    since = now if previous is None or previous.status != status else previous.last_transition_time
    condition = Condition(
        type=type,
        status=status,
        reason=reason,
        message=message[:MAX_MESSAGE],
        observed_generation=generation,
        last_transition_time=since,
    )
    if previous is None:
        return [*conditions, condition]
    return [condition if c.type == type else c for c in conditions]


def one_line(text: str | None, limit: int = MAX_LINE) -> str | None:
    """The last non-blank line of a text, its whitespace collapsed and cut to fit."""
    lines = [" ".join(line.split()) for line in (text or "").splitlines()]
    last = next((line for line in reversed(lines) if line), None)
    return None if last is None else cut(last, limit)


def cut(text: str, limit: int = MAX_LINE) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def find_condition(conditions: list[Condition], type: str) -> Condition | None:
    return next((c for c in conditions if c.type == type), None)
