"""The exception that becomes a JSON error response, and that response."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from gymkube_envserver.wire import ERROR_STATUS, RETRY_AFTER_CODES, ErrorCode, error_body


def error_json(code: ErrorCode, message: str, retry_after_s: int | None = None) -> JSONResponse:
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return JSONResponse(error_body(code, message), status_code=ERROR_STATUS[code], headers=headers)


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

    @property
    def retry_after_header_s(self) -> int | None:
        """Retry-After of its response: only where the code says to come back."""
        return self.retry_after_s if self.code in RETRY_AFTER_CODES else None

    def response(self) -> JSONResponse:
        return error_json(self.code, self.message, self.retry_after_header_s)
