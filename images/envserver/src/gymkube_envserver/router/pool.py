"""The router's view of its env servers: addresses, polled load, placement and session ids.

A session id the client sees is ``<token>.<backend id>``, where the token is the backend's
``host:port`` in unpadded urlsafe base64. Every router replica derives the same token from the
same address, so any replica routes any session and a restart loses nothing.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError

from gymkube_envserver.openenv_wire import CloseCode
from gymkube_envserver.router.settings import RouterSettings
from gymkube_envserver.router.upstream import ConnectFailed, Upstream, UpstreamError
from gymkube_envserver.wire import CanaryStatus, ErrorCode, StatusResponse

if TYPE_CHECKING:
    from gymkube_envserver.router.tunnel import Tunnel

log = logging.getLogger("gymkube.router")


class RoutingError(Exception):
    """A request the router answers itself, with a wire error code."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def session_lost(backend: Backend) -> RoutingError:
    return RoutingError(
        ErrorCode.SESSION_LOST, f"the env server holding this session ({backend.address}) is gone"
    )


def address_token(address: str) -> str:
    return base64.urlsafe_b64encode(address.encode()).rstrip(b"=").decode()


def token_address(token: str) -> str | None:
    """The ``host:port`` a token names, or None when it is not a token at all."""
    try:
        raw = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True)
        address = raw.decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    host, sep, port = address.rpartition(":")
    return address if sep and host and port.isdigit() else None


_NO_SUCH_NAME = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}

BackendState = Literal["ready", "draining", "unready", "dead", "retired", "unknown"]


@dataclass(eq=False)
class Backend:
    """One env server as this replica sees it."""

    address: str
    token: str = field(init=False)
    host: str = field(init=False)
    port: int = field(init=False)
    # "Host: ...\r\n" for requests to this server.
    host_header: bytes = field(init=False)
    status: StatusResponse | None = None
    # Known unreachable: its sessions answer 410 until a poll succeeds again.
    dead: bool = False
    # Gone from DNS: gets no new sessions, dropped at its first failed poll.
    retired: bool = False
    # When it last answered anything, a poll or a proxied call (time.monotonic()).
    heard_at: float = field(default_factory=time.monotonic)
    last_error: str | None = None
    last_poll_at: float | None = None
    # Sessions this replica is placing here now: the server may or may not count them yet.
    opening: int = 0
    # Sessions placed minus sessions closed through this replica since the last poll was sent.
    unreported: int = 0
    placed: int = 0
    errors: int = 0
    lost: int = 0
    # Requests waiting on this backend, with when they were sent (time.monotonic()).
    inflight: dict[asyncio.Task[Any], float] = field(default_factory=dict)
    # WebSocket sessions tunnelled to this backend.
    tunnels: set[Tunnel] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.token = address_token(self.address)
        host, _, port = self.address.rpartition(":")
        self.host = host.strip("[]")  # an IPv6 literal connects without its brackets
        self.port = int(port)
        self.host_header = f"Host: {self.address}\r\n".encode()

    @property
    def free(self) -> int:
        if self.status is None:
            return 0
        return self.status.capacity - self.status.active - self.opening - self.unreported

    @property
    def placeable(self) -> bool:
        status = self.status
        return (
            status is not None
            and status.ready
            and not status.draining
            and not self.dead
            and not self.retired
        )

    @property
    def state(self) -> BackendState:
        if self.dead:
            return "dead"
        if self.status is None:
            return "unknown"
        if self.retired:
            return "retired"
        if self.status.draining:
            return "draining"
        return "ready" if self.status.ready else "unready"

    def session_id(self, backend_id: str) -> str:
        return f"{self.token}.{backend_id}"

    def heard(self) -> None:
        self.heard_at = time.monotonic()

    def silent_for(self) -> float:
        return time.monotonic() - self.heard_at


class Pool:
    """Backends, their polled status and this replica's placements."""

    def __init__(self, settings: RouterSettings, upstream: Upstream) -> None:
        self._settings = settings
        self._upstream = upstream
        self.backends: dict[str, Backend] = {}
        self._by_token: dict[str, Backend] = {}
        self._pollers: dict[str, asyncio.Task[None]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._room = asyncio.Event()
        # Creates waiting for room right now (the operator's autoscaler reads them in /status).
        self.waiting = 0
        # Set (and replaced) after every DNS resolution; waiters hold the one they saw.
        self._resolution = asyncio.Event()
        self._resolve_now = asyncio.Event()

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        if self._settings.backends_dns:
            self._tasks.append(asyncio.create_task(self._resolve_loop(self._settings.backends_dns)))
        else:
            self._set_addresses(self._settings.backends)

    async def stop(self) -> None:
        tasks = [*self._tasks, *self._pollers.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- session ids -----------------------------------------------------------------------

    async def lookup(self, session_id: str) -> tuple[Backend, str]:
        """The backend holding a session and the backend's own id for it."""
        token, sep, backend_id = session_id.partition(".")
        backend = self._by_token.get(token)
        if backend is None:
            if not sep or not backend_id:
                raise RoutingError(ErrorCode.SESSION_NOT_FOUND, f"unknown session {session_id!r}")
            backend = await self._unknown_token(token, session_id)
        if backend.dead:
            backend.lost += 1
            raise session_lost(backend)
        return backend, backend_id

    async def _unknown_token(self, token: str, session_id: str) -> Backend:
        address = token_address(token)
        if address is None:
            raise RoutingError(ErrorCode.SESSION_NOT_FOUND, f"unknown session {session_id!r}")
        if self._settings.backends_dns:
            # Another replica may have seen this backend in DNS before we did.
            resolution = self._resolution
            self._resolve_now.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(resolution.wait(), self._settings.connect_timeout)
            backend = self._by_token.get(token)
            if backend is not None:
                return backend
        raise RoutingError(
            ErrorCode.SESSION_LOST,
            f"the env server holding this session ({address}) is not in the pool any more",
        )

    # -- placement -------------------------------------------------------------------------

    def pick(self, exclude: set[Backend]) -> Backend | None:
        """The placeable backend with the most free slots, warm envs breaking ties.

        A server silent for two poll intervals gets new sessions only when no other has room:
        it may be frozen (its sessions are lost when the dead window ends) or only slow.
        """
        best: Backend | None = None
        best_key = (False, 0, 0)
        quiet_limit = 2 * self._settings.poll_interval
        for backend in self.backends.values():
            if backend in exclude or not backend.placeable or backend.free <= 0:
                continue
            answering = backend.silent_for() <= quiet_limit
            key = (answering, backend.free, backend.status.warm if backend.status else 0)
            if best is None or key > best_key:
                best, best_key = backend, key
        return best

    def mark_full(self, backend: Backend) -> None:
        """A backend refused a /create: treat it as full until its next poll says otherwise."""
        if backend.status is not None:
            backend.unreported = backend.status.capacity - backend.status.active - backend.opening

    def closed(self, backend: Backend) -> None:
        backend.unreported -= 1
        self._wake()

    async def wait_for_room(self, seconds: float) -> None:
        room = self._room
        self.waiting += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(room.wait(), seconds)
        finally:
            self.waiting -= 1

    def resolve_soon(self) -> None:
        """Resolve the backends' DNS name now rather than at the next interval."""
        self._resolve_now.set()

    def _wake(self) -> None:
        self._room.set()
        self._room = asyncio.Event()

    def any_ready(self) -> Backend | None:
        for backend in self.backends.values():
            if backend.placeable:
                return backend
        return None

    # -- membership ------------------------------------------------------------------------

    def _set_addresses(self, addresses: Iterable[str]) -> None:
        wanted = set(addresses)
        for address in wanted - self.backends.keys():
            backend = Backend(address)
            self.backends[address] = backend
            self._by_token[backend.token] = backend
            self._pollers[address] = asyncio.create_task(self._poll_loop(backend))
            log.info("backend %s joined", address)
        for address in self.backends.keys() - wanted:
            backend = self.backends[address]
            if not backend.retired:
                backend.retired = True
                log.info("backend %s left DNS; routing its sessions while it answers", address)
        for address in wanted:
            self.backends[address].retired = False

    def _drop(self, backend: Backend) -> None:
        self.backends.pop(backend.address, None)
        self._by_token.pop(backend.token, None)
        self._lose(backend, "left the pool")
        self._upstream.forget(backend.host, backend.port)
        poller = self._pollers.pop(backend.address, None)
        if poller is not None and poller is not asyncio.current_task():
            poller.cancel()

    def _lose(self, backend: Backend, why: str) -> None:
        if not backend.dead:
            log.warning("backend %s %s; its sessions are lost", backend.address, why)
        backend.dead = True
        for task in list(backend.inflight):
            task.cancel()
        for tunnel in list(backend.tunnels):
            reason = f"session_lost: the env server {backend.address} {why}"
            tunnel.end(CloseCode.SESSION_LOST, reason)

    async def _resolve_loop(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        loop = asyncio.get_running_loop()
        while True:
            self._resolve_now.clear()
            try:
                infos = await loop.getaddrinfo(
                    host, int(port), family=socket.AF_INET, type=socket.SOCK_STREAM
                )
                self._set_addresses(f"{info[4][0]}:{port}" for info in infos)
            except OSError as exc:
                log.warning("resolving %s failed: %s", host, exc)
                # No such name: the headless Service has no endpoints, every backend is gone.
                # Anything else (a DNS timeout) says nothing about the backends: keep them.
                if isinstance(exc, socket.gaierror) and exc.errno in _NO_SUCH_NAME:
                    self._set_addresses(())
            self._resolution.set()
            self._resolution = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._resolve_now.wait(), self._settings.dns_interval)

    # -- polling ---------------------------------------------------------------------------

    async def _poll_loop(self, backend: Backend) -> None:
        while True:
            started = time.monotonic()
            await self.poll(backend)
            if backend.address not in self.backends:
                return
            elapsed = time.monotonic() - started
            await asyncio.sleep(max(0.0, self._settings.poll_interval - elapsed))

    async def poll(self, backend: Backend) -> None:
        """Fetch one backend's /status and update what placement and routing know of it."""
        unreported_before = backend.unreported
        openenv = self._settings.backend_protocol == "openenv"
        path = b"/health" if openenv else b"/status"
        # A poll waits for its answer until the server has been silent for the dead window: a
        # slow server's late answer is heard, and a silent one is found dead when it ends. A
        # server already dead or gone from DNS gets one poll interval.
        window_left = self._settings.dead_after_seconds - backend.silent_for()
        wait = (
            window_left if window_left > 0 and not backend.retired else self._settings.poll_interval
        )
        try:
            async with asyncio.timeout(wait):
                reply = await self._upstream.call(
                    backend.host,
                    backend.port,
                    b"GET %s HTTP/1.1\r\n%s\r\n" % (path, backend.host_header),
                )
        except (UpstreamError, TimeoutError) as exc:
            self._unreachable(backend, exc)
            return
        payload, code = reply.body, reply.status
        backend.heard()
        backend.last_poll_at = time.time()
        if backend.dead:
            log.info("backend %s answers again", backend.address)
            backend.dead = False
        try:
            if code != 200:
                raise ValueError(f"{path.decode()} answered {code}")
            status = (
                self._openenv_status(backend)
                if openenv
                else StatusResponse.model_validate_json(payload)
            )
        except (ValueError, ValidationError) as exc:
            # It answers, so its sessions live on; it just gets no new ones.
            backend.status = None
            backend.last_error = f"{type(exc).__name__}: {exc}"[:500]
            return
        # Placements finished after the poll was sent are not in its answer yet, and those
        # still opening stay counted as opening whether the answer has them or not.
        backend.unreported -= unreported_before
        backend.status = status
        backend.last_error = None
        if backend.free > 0 and backend.placeable:
            self._wake()

    def _openenv_status(self, backend: Backend) -> StatusResponse:
        """What an OpenEnv server that answered /health stands for: the spec's capacity and
        the sockets this replica tunnels to it (it reports neither itself)."""
        capacity = self._settings.backend_capacity or 0
        return StatusResponse(
            env="openenv",
            active=len(backend.tunnels),
            capacity=capacity,
            warm=0,
            warm_target=0,
            draining=False,
            served=backend.placed,
            ready=True,
            canary=CanaryStatus(),
        )

    def _unreachable(self, backend: Backend, exc: BaseException) -> None:
        backend.last_error = f"{type(exc).__name__}: {exc}"
        if backend.retired:
            self._drop(backend)
        elif (isinstance(exc, ConnectFailed) and exc.refused) or (
            backend.silent_for() >= self._settings.dead_after_seconds
        ):
            # Refused means nothing listens, so whatever sessions it held are gone.
            self._lose(backend, f"does not answer ({backend.last_error})")
