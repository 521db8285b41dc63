"""Keep-alive HTTP/1.1 connections from the router to its env servers.

A routed step is one request and one response over a pooled connection, so the client side is
a protocol object per connection and httptools' parser, nothing per request beyond the reply.
(aiohttp's ClientSession spent about 85 µs of CPU per call here: most of the router's cost.)
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import cast

import httptools


class UpstreamError(Exception):
    """A call that got no HTTP answer."""


class ConnectFailed(UpstreamError):
    """No connection: refused, unreachable, or no answer within the connect timeout."""

    def __init__(self, message: str, refused: bool) -> None:
        super().__init__(message)
        # Refused: the address answers but nothing listens, so the server process is gone.
        self.refused = refused


class ConnectionDropped(UpstreamError):
    """The connection closed or broke before the answer was complete."""


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes
    content_type: bytes | None
    retry_after: bytes | None


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[Reply] | None = None
        self._chunks: list[bytes] = []
        self._content_type: bytes | None = None
        self._retry_after: bytes | None = None
        self.keep_alive = True
        self.closed = False
        self.idle_since = 0.0

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, but have its methods.
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ConnectionDropped(str(exc) if exc else "connection closed"))

    def eof_received(self) -> None:
        # The server closed its side (an idle keep-alive timeout): never reuse this one.
        self.closed = True

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionDropped(f"unreadable answer: {exc}"))
            self.close()

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-type":
            self._content_type = value
        elif name == b"retry-after":
            self._retry_after = value

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        waiter, self._waiter = self._waiter, None
        self.keep_alive = self._parser.should_keep_alive()
        reply = Reply(
            self._parser.get_status_code(),
            b"".join(self._chunks),
            self._content_type,
            self._retry_after,
        )
        if waiter is not None and not waiter.done():
            waiter.set_result(reply)

    # use
    def send(self, request: bytes) -> asyncio.Future[Reply]:
        assert self._transport is not None
        self._chunks = []
        self._content_type = self._retry_after = None
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        self._transport.write(request)
        return waiter

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    def _fail(self, error: UpstreamError) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)


class Upstream:
    """Pools of idle keep-alive connections, one pool per env server address."""

    def __init__(self, connect_timeout: float, keepalive_timeout: float) -> None:
        self._connect_timeout = connect_timeout
        self._keepalive_timeout = keepalive_timeout
        self._idle: dict[tuple[str, int], list[_Connection]] = {}

    async def call(self, host: str, port: int, request: bytes, fresh: bool = False) -> Reply:
        """Send one raw request over an idle pooled connection, or a new one when ``fresh``."""
        idle = self._idle.setdefault((host, port), [])
        connection = None if fresh else self._take(idle)
        if connection is None:
            connection = await self._connect(host, port)
        try:
            reply = await connection.send(request)
        except BaseException:
            # Cancelled or broken mid-request: the connection's state is unknown.
            connection.close()
            raise
        if connection.keep_alive and not connection.closed:
            connection.idle_since = time.monotonic()
            idle.append(connection)
        else:
            connection.close()
        return reply

    def sweep(self) -> None:
        """Close connections idle longer than the keep-alive timeout."""
        stale = time.monotonic() - self._keepalive_timeout
        for idle in self._idle.values():
            keep = []
            for connection in idle:
                if not connection.closed and connection.idle_since >= stale:
                    keep.append(connection)
                else:
                    connection.close()
            idle[:] = keep

    def forget(self, host: str, port: int) -> None:
        for connection in self._idle.pop((host, port), []):
            connection.close()

    def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()

    def _take(self, idle: list[_Connection]) -> _Connection | None:
        stale = time.monotonic() - self._keepalive_timeout
        while idle:
            connection = idle.pop()
            if not connection.closed and connection.idle_since >= stale:
                return connection
            connection.close()
        return None

    async def _connect(self, host: str, port: int) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, connection = await loop.create_connection(_Connection, host, port)
        except TimeoutError:
            raise ConnectFailed(
                f"no connection to {host}:{port} within {self._connect_timeout}s", refused=False
            ) from None
        except OSError as exc:
            raise ConnectFailed(
                f"cannot connect to {host}:{port}: {exc}",
                refused=isinstance(exc, ConnectionRefusedError),
            ) from None
        return connection
