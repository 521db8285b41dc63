"""OpenEnv's wire protocol as gymkube pools speak it: paths, close codes, error codes, the
placement header and error frames.

The env server (``gymkube_envserver.openenv``) and the router both import these; the router
needs nothing else of the server's OpenEnv module (nor FastAPI).
"""

from __future__ import annotations

import json
from enum import IntEnum, StrEnum
from typing import Any

WS_PATH = "/ws"
"""Where OpenEnv clients open their session socket (``http://host/pool`` -> ``ws://host/pool/ws``)."""
HTTP_PATHS = ("/health", "/schema", "/metadata")
"""OpenEnv's HTTP endpoints a pool answers (``AutoEnv`` checks ``/health``)."""
PLACEMENT_HEADER = "X-Gymkube-Placement"
"""Sent by a router placing a session on ``WS_PATH``. A server that cannot take the session then
refuses the upgrade with its HTTP error, which the router reads and places the session elsewhere,
instead of OpenEnv's accept-then-error-frame, which only reaches the client."""


class OpenEnvErrorCode(StrEnum):
    """``data.code`` of an error frame: OpenEnv's own codes, so its clients read them as usual."""

    INVALID_JSON = "INVALID_JSON"
    UNKNOWN_TYPE = "UNKNOWN_TYPE"
    VALIDATION_ERROR = "VALIDATION_ERROR"
    EXECUTION_ERROR = "EXECUTION_ERROR"
    CAPACITY_REACHED = "CAPACITY_REACHED"
    SESSION_ERROR = "SESSION_ERROR"


class CloseCode(IntEnum):
    """WebSocket close codes of gymkube pools (the reason text says more)."""

    NORMAL = 1000
    """The client closed, or the session was refused at capacity (as OpenEnv's server does)."""
    GOING_AWAY = 1001
    """The env server or the router in front of it is shutting down; reconnect."""
    SESSION_EXPIRED = 4408
    """The server closed the session: idle past ``--idle-timeout``."""
    SESSION_LOST = 4410
    """The session's env or env server died or froze (HTTP's 410); reconnect for a new one."""


CLOSE_REASON_BYTES = 123
"""A close frame's reason must fit in 123 bytes of UTF-8."""


def close_reason(text: str) -> str:
    return text.encode()[:CLOSE_REASON_BYTES].decode(errors="ignore")


def error_frame(code: OpenEnvErrorCode, message: str, **extra: Any) -> str:
    return json.dumps({"type": "error", "data": {"message": message, "code": code, **extra}})
