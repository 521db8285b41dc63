"""The bytes the router passes on: requests to a backend, and session ids spliced into bodies.

Bodies are not re-encoded: only the ``id`` is found and replaced, which keeps the router's own
CPU per routed step small.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from json.encoder import encode_basestring_ascii
from typing import Any

from aiohttp import web

from gymkube_envserver.router.pool import Backend
from gymkube_envserver.router.upstream import Reply

JSON = "application/json"


def json_response(
    status: int, payload: Any, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(body=dumps(payload), status=status, content_type=JSON, headers=headers)


def passed_headers(reply: Reply) -> dict[str, str]:
    content_type = reply.content_type.decode("latin-1") if reply.content_type else JSON
    if reply.retry_after is None:
        return {"Content-Type": content_type}
    return {"Content-Type": content_type, "Retry-After": reply.retry_after.decode("latin-1")}


def http_request(method: bytes, target: bytes, host_header: bytes, body: bytes | None) -> bytes:
    if body is None:
        return b"%s %s HTTP/1.1\r\n%s\r\n" % (method, target, host_header)
    return b"%s %s HTTP/1.1\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        method,
        target,
        host_header,
        len(body),
        body,
    )


def dumps(message: Any) -> bytes:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()


def swap_id(body: bytes, message: dict[str, Any], old: str, new: str) -> bytes:
    """``body`` with its id ``old`` replaced by ``new`` (``message`` is body parsed, new id set).

    Splicing the bytes is several times cheaper than re-encoding. It is exact when the quoted
    id occurs once: inside another JSON string its quotes would be escaped.
    """
    needle = encode_basestring_ascii(old).encode()
    if body.count(needle) == 1:
        return body.replace(needle, encode_basestring_ascii(new).encode())
    return dumps(message)


def was_open(close_payload: bytes) -> bool:
    try:
        message = json.loads(close_payload.decode())
    except ValueError:
        return True
    return not isinstance(message, dict) or message.get("was_open") is not False


def rewrite_id(backend: Backend, payload: bytes) -> bytes:
    try:
        message = json.loads(payload.decode())
    except ValueError:
        return payload
    if isinstance(message, dict) and isinstance(message.get("id"), str):
        backend_id = message["id"]
        message["id"] = backend.session_id(backend_id)
        return swap_id(payload, message, backend_id, message["id"])
    return payload
