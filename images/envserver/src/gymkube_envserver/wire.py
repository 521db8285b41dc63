"""Wire messages of the gymkube env protocol (an AgentGym-compatible superset).

Stable names other components import (the router, the agent loop, tests):

- ``ErrorCode``: the machine-readable ``error.code`` values; ``ERROR_STATUS`` maps each to its
  HTTP status; ``RETRY_AFTER_CODES`` are the codes sent with a ``Retry-After`` header.
- ``ErrorDetail`` / ``ErrorBody``: every non-2xx response body, ``{"error": {"code", "message"}}``;
  ``error_body(code, message)`` builds one as a plain dict.
- ``StatusResponse`` (with ``CanaryStatus``): the ``GET /status`` body the router balances on.
- Request bodies: ``CreateRequest``, ``ResetRequest``, ``StepRequest``, ``CloseRequest``,
  ``DrainRequest``. Response bodies: ``CreateResponse``, ``ResetResponse``, ``StepResponse``,
  ``CloseResponse``, ``DetailResponse``, ``TasksResponse`` (with ``ScoreScale`` and ``TaskInfo``),
  ``HealthResponse``, ``ReadyResponse``, ``DrainResponse``.
- ``MAX_ACTION_CHARS``: the longest action ``/step`` accepts.

Ids are opaque strings. ``score`` stays in the env's own scale; ``/tasks`` says which.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

MAX_ACTION_CHARS = 16_384
"""Longest action accepted by ``/step``; longer ones get 422 ``bad_request``."""

MAX_ID_CHARS = 256


class ErrorCode(StrEnum):
    """``error.code`` values. A client that only checks for the ``error`` key keeps working."""

    SESSION_NOT_FOUND = "session_not_found"
    """404: the id was never issued here, or the session was closed or expired."""
    BAD_REQUEST = "bad_request"
    """422: malformed JSON, wrong types, out-of-range ``data_idx``, oversized action."""
    EPISODE_FINISHED = "episode_finished"
    """409: ``/step`` after ``done``; ``/reset`` starts a new episode."""
    EPISODE_NOT_STARTED = "episode_not_started"
    """409: ``/step`` or ``/observation`` before the first ``/reset``."""
    AT_CAPACITY = "at_capacity"
    """503 + ``Retry-After``: every session slot is taken."""
    DRAINING = "draining"
    """503 + ``Retry-After``: the server takes no new sessions."""
    NOT_READY = "not_ready"
    """503 + ``Retry-After``: ``/readyz`` or ``/tasks`` before the env is up (or while draining)."""
    SESSION_LOST = "session_lost"
    """410: the session's env (or its server) died; create a new session."""
    ENV_FAILURE = "env_failure"
    """500: the env raised while handling a valid request."""
    NOT_FOUND = "not_found"
    """404: no such endpoint."""
    METHOD_NOT_ALLOWED = "method_not_allowed"
    """405: the endpoint exists, the method does not."""
    PAYLOAD_TOO_LARGE = "payload_too_large"
    """413: the request body exceeds the server's limit."""
    INTERNAL = "internal"
    """500: a bug in the server itself."""


ERROR_STATUS: dict[ErrorCode, int] = {
    ErrorCode.SESSION_NOT_FOUND: 404,
    ErrorCode.BAD_REQUEST: 422,
    ErrorCode.EPISODE_FINISHED: 409,
    ErrorCode.EPISODE_NOT_STARTED: 409,
    ErrorCode.AT_CAPACITY: 503,
    ErrorCode.DRAINING: 503,
    ErrorCode.NOT_READY: 503,
    ErrorCode.SESSION_LOST: 410,
    ErrorCode.ENV_FAILURE: 500,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.INTERNAL: 500,
}

RETRY_AFTER_CODES: frozenset[ErrorCode] = frozenset(
    {ErrorCode.AT_CAPACITY, ErrorCode.DRAINING, ErrorCode.NOT_READY}
)


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


def error_body(code: ErrorCode | str, message: str) -> dict[str, Any]:
    """The JSON body of an error response."""
    return {"error": {"code": str(code), "message": message}}


SessionId = Annotated[
    str, Field(min_length=1, max_length=MAX_ID_CHARS, description="Opaque session id.")
]


class CreateRequest(BaseModel):
    env_config: dict[str, Any] | None = Field(
        default=None, description="Env-specific settings kept for the session's episodes."
    )


class CreateResponse(BaseModel):
    id: str


class ResetRequest(BaseModel):
    id: SessionId
    data_idx: int | None = Field(default=None, description="Task index, 0 <= data_idx < count.")
    seed: int | None = Field(default=None, description="Seed for envs with randomness.")
    env_config: dict[str, Any] | None = Field(
        default=None, description="Overrides the session's env_config for this episode."
    )
    replay: bool = Field(
        default=False,
        description="Set by a client rebuilding an episode whose session was lost (it then "
        "replays the episode's actions); counted in /status and /metrics, the episode is the same.",
    )


class ResetResponse(BaseModel):
    """Env-specific extra keys ride along (ScienceWorld: ``task_name``, ``var_num``)."""

    model_config = ConfigDict(extra="allow")

    id: str
    observation: str
    task_description: str
    reward: float
    score: float
    done: bool
    data_idx: int | None = None
    info: dict[str, Any] = Field(default_factory=dict)


class StepRequest(BaseModel):
    id: SessionId
    action: str = Field(max_length=MAX_ACTION_CHARS)


class StepResponse(BaseModel):
    observation: str
    reward: float
    score: float
    done: bool
    info: dict[str, Any] = Field(default_factory=dict)


class CloseRequest(BaseModel):
    id: SessionId


class CloseResponse(BaseModel):
    id: str
    closed: bool = True
    was_open: bool = Field(description="False when the id was already closed or never existed.")


class DetailResponse(BaseModel):
    """What ``/detail`` knows about a session (AgentGym's info dict plus gymkube's own keys)."""

    model_config = ConfigDict(extra="allow")

    id: str
    env: str
    started: bool
    done: bool
    deleted: bool = False
    data_idx: int | None = None
    task_description: str | None = None
    observation: str | None = None
    reward: float = 0.0
    score: float = 0.0
    steps: int = 0
    episodes: int = 0
    created_at: float
    last_active_at: float
    info: dict[str, Any] = Field(default_factory=dict)


class ScoreScale(BaseModel):
    min: float
    max: float


class TaskInfo(BaseModel):
    name: str
    first_idx: int = Field(description="The first data_idx of this task.")
    count: int = Field(description="How many consecutive data_idx values belong to it.")


class TasksResponse(BaseModel):
    env: str
    count: int = Field(description="Valid data_idx values are 0..count-1.")
    score_scale: ScoreScale
    task_names: list[str]
    tasks: list[TaskInfo]
    splits: dict[str, list[int]] = Field(
        default_factory=dict, description="Split name -> the data_idx values in it."
    )
    replayable: bool = Field(
        default=False,
        description="The same reset and actions give the same observations, so a client may "
        "rebuild a lost session's episode on another server.",
    )


class CanaryStatus(BaseModel):
    """The last canary episode (reset and one step on a spare env)."""

    ok: bool | None = Field(default=None, description="None until the first canary has run.")
    latency_ms: float | None = None
    at: float | None = Field(default=None, description="Unix time the canary finished.")
    error: str | None = None


class StatusResponse(BaseModel):
    env: str
    active: int = Field(description="Open sessions, with those being created.")
    capacity: int = Field(description="Most open sessions this server accepts.")
    warm: int = Field(
        description="Idle started envs waiting for a /create: pre-started ones and those that "
        "sessions gave back."
    )
    warm_target: int
    env_config: dict[str, Any] = Field(
        default_factory=dict, description="The default env_config of every session (--env-config)."
    )
    draining: bool
    served: int = Field(description="Sessions created since the server started.")
    envs_started: int = Field(
        default=0, description="Envs started since the server started (for ScienceWorld, JVMs)."
    )
    envs_reused: int = Field(
        default=0, description="Sessions that got an env an earlier session had given back."
    )
    envs_retired: dict[str, int] = Field(
        default_factory=dict,
        description="Envs closed instead of going back to the pool, by reason: failed, episodes, "
        "memory, not_reused, draining.",
    )
    replays: int = Field(
        default=0, description="Resets marked as replays (lost episodes rebuilt here) played."
    )
    ready: bool
    canary: CanaryStatus


class HealthResponse(BaseModel):
    status: str = "ok"


class ReadyResponse(BaseModel):
    ready: bool
    reason: str


class DrainRequest(BaseModel):
    draining: bool = Field(default=True, description="False resumes taking new sessions.")


class DrainResponse(BaseModel):
    draining: bool
    active: int
