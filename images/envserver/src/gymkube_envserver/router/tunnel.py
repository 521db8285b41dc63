"""WebSocket tunnels: an OpenEnv session socket pinned to the env server chosen at upgrade.

Frames pass through unparsed for the life of the connection; there is no per-message timeout
(a step may take as long as the env needs). A heartbeat ping to the env server finds one that
froze; a dead one shows as its socket closing. Either way the client's socket is closed with
``CloseCode.SESSION_LOST``, the WebSocket form of HTTP's 410.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import aiohttp
from aiohttp import WSMsgType, web

from gymkube_envserver.openenv_wire import CloseCode, OpenEnvErrorCode, close_reason, error_frame

# What a tunnel relays; anything else (close, error) ends it.
_DATA = (WSMsgType.TEXT, WSMsgType.BINARY)
# Close codes the env server itself sends on purpose; anything else means it went away.
_SERVER_CLOSES = frozenset({CloseCode.NORMAL, CloseCode.GOING_AWAY, CloseCode.SESSION_EXPIRED})


@dataclass(eq=False)
class Tunnel:
    """One client socket and the env-server socket it is pinned to."""

    client: web.WebSocketResponse
    upstream: aiohttp.ClientWebSocketResponse
    address: str
    messages: int = 0
    # Why the tunnel ended, once it has: the close code sent to the client.
    closed_with: CloseCode | int | None = None
    _ending: asyncio.Event = field(default_factory=asyncio.Event)
    _reason: str = ""

    async def run(self) -> None:
        pumps = [
            asyncio.create_task(self._client_to_upstream()),
            asyncio.create_task(self._upstream_to_client()),
        ]
        ending = asyncio.create_task(self._ending.wait())
        try:
            await asyncio.wait([*pumps, ending], return_when=asyncio.FIRST_COMPLETED)
            if self.closed_with is None:
                # The client left: end the env server's session with it.
                self.closed_with = CloseCode.NORMAL
            else:
                # Closed while the client's pump still reads: aiohttp's close() hands that
                # read the close handshake (a cancelled read would leave the socket unclosed).
                with contextlib.suppress(Exception):
                    await self._close_client()
        finally:
            for task in (*pumps, ending):
                task.cancel()
            await asyncio.gather(*pumps, ending, return_exceptions=True)
            with contextlib.suppress(Exception):
                await self.upstream.close()

    async def _close_client(self) -> None:
        if self.closed_with == CloseCode.SESSION_LOST:
            # A client waiting for a reply reads this as OpenEnv's server error.
            await self.client.send_str(error_frame(OpenEnvErrorCode.SESSION_ERROR, self._reason))
        await self.client.close(
            code=int(self.closed_with or CloseCode.NORMAL),
            message=close_reason(self._reason).encode(),
        )

    def end(self, code: CloseCode, reason: str) -> None:
        """Close the client's socket with ``code`` (from outside the tunnel's own tasks)."""
        if self.closed_with is None:
            self.closed_with = code
            self._reason = reason
        self._ending.set()

    async def _client_to_upstream(self) -> None:
        async for message in self.client:
            if message.type == WSMsgType.TEXT:
                await self.upstream.send_str(message.data)
            elif message.type == WSMsgType.BINARY:
                await self.upstream.send_bytes(message.data)
            self.messages += 1

    async def _upstream_to_client(self) -> None:
        upstream = self.upstream
        reason = "closed by the env server"
        async for message in upstream:
            if message.type not in _DATA:
                if message.type == WSMsgType.CLOSE and message.extra:
                    reason = str(message.extra)
                break
            if message.type == WSMsgType.TEXT:
                await self.client.send_str(message.data)
            else:
                await self.client.send_bytes(message.data)
            self.messages += 1
        code = upstream.close_code
        if code in _SERVER_CLOSES:
            # The env server closed the session itself (client's close, idle expiry, shutdown).
            self.end(CloseCode(code), reason)
        else:
            self.end(
                CloseCode.SESSION_LOST,
                f"session_lost: the env server {self.address} is gone",
            )
