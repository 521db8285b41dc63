"""The exception that becomes a JSON error response."""

from __future__ import annotations

from gymkube_envserver.wire import ERROR_STATUS, ErrorCode


class ApiError(Exception):
    """Raised by request handling; the app turns it into ``{"error": {"code", "message"}}``."""

    def __init__(self, code: ErrorCode, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s

    @property
    def status(self) -> int:
        return ERROR_STATUS[self.code]
