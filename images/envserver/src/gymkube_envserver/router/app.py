"""The router's aiohttp handler: dispatch, the HTTP session endpoints and WebSocket placement.

Stateless: a session id names its backend (see ``pool``), so any replica routes any
session. Request and response bodies pass through as bytes; only the ``id`` is parsed and
rewritten, which keeps the router's own CPU per step small.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

import aiohttp
from aiohttp import web
from multidict import MultiDict

from gymkube_envserver.openenv_wire import (
    PLACEMENT_HEADER,
    CloseCode,
    OpenEnvErrorCode,
    error_frame,
)
from gymkube_envserver.router.bodies import (
    JSON,
    http_request,
    json_response,
    passed_headers,
    rewrite_id,
    swap_id,
    was_open,
)
from gymkube_envserver.router.endpoints import (
    ANY_BACKEND_ENDPOINTS,
    ID_RESPONSES,
    KNOWN_ENDPOINTS,
    TUNNEL_ENDPOINT,
)
from gymkube_envserver.router.metrics import RouterMetrics
from gymkube_envserver.router.pool import Backend, Pool, RoutingError, session_lost
from gymkube_envserver.router.settings import RouterSettings
from gymkube_envserver.router.status import pool_status
from gymkube_envserver.router.tunnel import Tunnel
from gymkube_envserver.router.upstream import ConnectFailed, ConnectionDropped, Upstream
from gymkube_envserver.wire import ERROR_STATUS, RETRY_AFTER_CODES, ErrorCode, error_body

log = logging.getLogger("gymkube.router")


Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


class BackendGone(Exception):
    """A backend call failed because the server is gone (refused, reset, hung, left DNS)."""

    def __init__(self, backend: Backend) -> None:
        super().__init__(backend.address)
        self.backend = backend


class Router:
    def __init__(self, settings: RouterSettings) -> None:
        self.settings = settings
        self._upstream = Upstream(settings.connect_timeout, settings.keepalive_timeout)
        self._pool: Pool | None = None
        self._metrics: RouterMetrics | None = None
        self._sweeper: asyncio.Task[None] | None = None
        # Requests the sweeper cancelled for running past --request-timeout.
        self._overdue: set[asyncio.Task[Any]] = set()
        # /close calls for sessions whose client left during /create.
        self._orphan_closes: set[asyncio.Task[Any]] = set()
        self._ws_client: aiohttp.ClientSession | None = None
        self._routes: dict[tuple[str, str], Handler] = {
            ("GET", "/healthz"): self._healthz,
            ("GET", "/readyz"): self._readyz,
            ("GET", "/status"): self._status,
            ("GET", "/metrics"): self._metrics_text,
            ("POST", "/create"): self._create,
            **{("GET", path): self._any_backend for path in ANY_BACKEND_ENDPOINTS},
        }

    @property
    def pool(self) -> Pool:
        assert self._pool is not None, "router not started"
        return self._pool

    @property
    def metrics(self) -> RouterMetrics:
        assert self._metrics is not None, "router not started"
        return self._metrics

    async def start(self) -> None:
        self._pool = Pool(self.settings, self._upstream)
        self._metrics = RouterMetrics(self._pool)
        await self._pool.start()
        self._sweeper = asyncio.create_task(self._sweep())
        self._ws_client = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, connect=self.settings.connect_timeout),
            auto_decompress=False,
        )

    async def close_tunnels(self) -> None:
        """End every open WebSocket with 1001: its client reconnects through another replica."""
        for backend in self.pool.backends.values():
            for tunnel in list(backend.tunnels):
                tunnel.end(CloseCode.GOING_AWAY, "the router is shutting down; reconnect")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._ws_client is not None:
            await self._ws_client.close()
        if self._pool is not None:
            await self._pool.stop()
        self._upstream.close()

    async def _sweep(self) -> None:
        """Once a second: close stale idle connections, cancel requests past their deadline.

        The deadline lives here rather than in a timer per request, which would cost more
        CPU than the rest of a routed step's own bookkeeping.
        """
        while True:
            await asyncio.sleep(1.0)
            self._upstream.sweep()
            deadline = time.monotonic() - self.settings.request_timeout
            for backend in list(self.pool.backends.values()):
                for task, sent in list(backend.inflight.items()):
                    if sent < deadline and task not in self._overdue:
                        self._overdue.add(task)
                        task.cancel()

    # -- dispatch --------------------------------------------------------------------------

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        if path == TUNNEL_ENDPOINT and request.method == "GET":
            return await self._websocket(request)
        started = time.perf_counter()
        handler = self._routes.get((request.method, path))
        try:
            if handler is not None:
                response = await handler(request)
            elif request.method == "POST":
                response = await self._route_body(request, path)
            elif request.method == "GET":
                response = await self._route_query(request, path)
            else:
                response = json_response(
                    405, error_body(ErrorCode.METHOD_NOT_ALLOWED, f"{request.method} {path}")
                )
        except RoutingError as exc:
            response = _error(exc, self.settings.retry_after)
        except BackendGone as exc:
            exc.backend.lost += 1
            response = _error(session_lost(exc.backend), self.settings.retry_after)
        except web.HTTPRequestEntityTooLarge as exc:
            response = json_response(
                413, error_body(ErrorCode.PAYLOAD_TOO_LARGE, exc.text or "request body too large")
            )
        except Exception:
            log.exception("router failed on %s %s", request.method, path)
            response = json_response(
                500, error_body(ErrorCode.INTERNAL, "the router failed; see its log")
            )
        upstream = request.get("upstream_seconds", 0.0)
        self.metrics.observe(
            path if path in KNOWN_ENDPOINTS else "other",
            response.status,
            time.perf_counter() - started - upstream,
        )
        return response

    # -- session-scoped endpoints ----------------------------------------------------------

    async def _route_body(self, request: web.BaseRequest, path: str) -> web.StreamResponse:
        body = await request.read()
        try:
            message = json.loads(body.decode())
            session_id = message["id"]
        except (ValueError, TypeError, KeyError):
            raise RoutingError(
                ErrorCode.BAD_REQUEST, 'expected a JSON object with an "id"'
            ) from None
        if not isinstance(session_id, str):
            raise RoutingError(ErrorCode.SESSION_NOT_FOUND, f"unknown session {session_id!r}")
        backend, backend_id = await self.pool.lookup(session_id)
        message["id"] = backend_id
        status, payload, headers = await self._forward(
            request,
            backend,
            b"POST",
            request.raw_path,
            swap_id(body, message, session_id, backend_id),
        )
        if path == "/close" and status < 300 and was_open(payload):
            self.pool.closed(backend)
        return self._respond(backend, path, status, payload, headers)

    async def _route_query(self, request: web.BaseRequest, path: str) -> web.StreamResponse:
        session_id = request.query.get("id")
        if session_id is None:
            raise RoutingError(ErrorCode.NOT_FOUND, f"no endpoint GET {path} without ?id=")
        backend, backend_id = await self.pool.lookup(session_id)
        query = MultiDict(request.query)
        query["id"] = backend_id
        target = f"{request.rel_url.raw_path}?{urlencode(list(query.items()))}"
        status, payload, headers = await self._forward(request, backend, b"GET", target, None)
        return self._respond(backend, path, status, payload, headers)

    def _respond(
        self, backend: Backend, path: str, status: int, payload: bytes, headers: dict[str, str]
    ) -> web.Response:
        if status < 300 and path in ID_RESPONSES:
            payload = rewrite_id(backend, payload)
        return web.Response(body=payload, status=status, headers=headers)

    async def _forward(
        self,
        request: web.BaseRequest,
        backend: Backend,
        method: bytes,
        target: str,
        body: bytes | None,
    ) -> tuple[int, bytes, dict[str, str]]:
        """One backend call; raises ``BackendGone`` when the server is not there any more."""
        raw = http_request(method, target.encode(), backend.host_header, body)
        task: asyncio.Task[Any] | None = asyncio.current_task()
        assert task is not None
        sent = time.perf_counter()
        backend.inflight[task] = time.monotonic()
        try:
            # A reset on a pooled connection may be the backend closing it while idle; one
            # retry on a fresh connection tells that apart from a dead server (refused).
            for attempt in (1, 2):
                try:
                    reply = await self._upstream.call(
                        backend.host, backend.port, raw, fresh=attempt == 2
                    )
                    backend.heard()
                    return reply.status, reply.body, passed_headers(reply)
                except ConnectFailed:
                    backend.errors += 1
                    break
                except ConnectionDropped:
                    backend.errors += 1
                    if attempt == 2 or backend.dead:
                        break
            raise BackendGone(backend)
        except asyncio.CancelledError:
            if task in self._overdue:
                self._overdue.discard(task)
                task.uncancel()
                raise RoutingError(
                    ErrorCode.ENV_FAILURE,
                    f"env server {backend.address} took over {self.settings.request_timeout}s",
                ) from None
            # The pool cancels in-flight calls of a backend it found dead.
            if not backend.dead:
                raise
            task.uncancel()
            raise BackendGone(backend) from None
        finally:
            backend.inflight.pop(task, None)
            request["upstream_seconds"] = request.get("upstream_seconds", 0.0) + (
                time.perf_counter() - sent
            )

    # -- pool endpoints --------------------------------------------------------------------

    async def _create(self, request: web.BaseRequest) -> web.StreamResponse:
        body = await request.read()
        pool = self.pool
        refused: set[Backend] = set()
        async for backend in self._placements(self.settings.create_wait, refused):
            backend.opening += 1
            try:
                status, payload, headers = await self._forward(
                    request, backend, b"POST", "/create", body
                )
            except BackendGone:
                refused.add(backend)
                continue
            finally:
                backend.opening -= 1
            if status == 503:
                pool.mark_full(backend)
                refused.add(backend)
                continue
            if status >= 300:
                return web.Response(body=payload, status=status, headers=headers)
            backend.unreported += 1
            backend.placed += 1
            if request.transport is None or request.transport.is_closing():
                # The client gave up while the server was starting an env (a cold JVM takes a
                # second or more): nobody will learn this session's id, so close it now rather
                # than leave its env to the server's idle reaper.
                self._close_orphan(request, backend, payload)
            return self._respond(backend, "/create", status, payload, headers)
        self.metrics.pool_full += 1
        raise RoutingError(ErrorCode.AT_CAPACITY, self._no_room(self.settings.create_wait))

    def _no_room(self, wait_s: float) -> str:
        held = max(wait_s, self.settings.create_hold)
        if self.pool.any_ready() is None and self.settings.create_hold:
            return (
                f"no env server became ready in {held:g} s "
                "(the pool is scaling up, or its servers fail to start: see the EnvPool's status)"
            )
        return f"every env server in the pool stayed full or not ready for {held:g} s"

    async def _placements(self, wait_s: float, refused: set[Backend]) -> AsyncIterator[Backend]:
        """Backends to place a new session on, the most room first, skipping those the caller
        added to refused; when none has room, waits up to wait_s for some (then tries them all
        again). Ends when the wait is over."""
        pool = self.pool
        hold = self.settings.create_hold
        deadline = time.monotonic() + max(wait_s, hold)
        waited = False
        while True:
            backend = pool.pick(refused)
            if backend is not None:
                yield backend
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            if not waited:
                waited = True
                self.metrics.create_waits += 1
            if hold and pool.any_ready() is None:
                # Scaling up: look for the new server in DNS each second, not each interval.
                pool.resolve_soon()
                remaining = min(remaining, 1.0)
            await pool.wait_for_room(remaining)
            refused.clear()

    async def _websocket(self, request: web.BaseRequest) -> web.StreamResponse:
        """An OpenEnv session: placed now, tunnelled to that backend until either side closes."""
        client = web.WebSocketResponse(autoping=True, compress=False, max_msg_size=0)
        if not client.can_prepare(request).ok:
            message = f"{TUNNEL_ENDPOINT} takes WebSocket upgrades"
            return json_response(400, error_body(ErrorCode.BAD_REQUEST, message))
        # Upgraded first: a session held while the pool scales up would otherwise outlast the
        # client's connect timeout; what the client sends meanwhile waits in the socket.
        await client.prepare(request)
        placed = await self._place_websocket()
        if placed is None:
            # OpenEnv's own answer to a full server, which its clients raise from the first reset.
            self.metrics.pool_full += 1
            status = pool_status(self.pool)
            await client.send_str(
                error_frame(
                    OpenEnvErrorCode.CAPACITY_REACHED,
                    self._no_room(self.settings.ws_create_wait),
                    active_sessions=status.active,
                    max_sessions=status.capacity,
                    retry_after_s=self.settings.retry_after,
                )
            )
            await client.close(code=CloseCode.NORMAL, message=b"pool at capacity")
            return client
        backend, upstream = placed
        tunnel = Tunnel(client, upstream, backend.address)
        backend.tunnels.add(tunnel)
        self.metrics.tunnels_opened += 1
        try:
            await tunnel.run()
        finally:
            backend.tunnels.discard(tunnel)
            self.pool.closed(backend)
            self.metrics.tunnel_closed(tunnel)
        return client

    async def _place_websocket(
        self,
    ) -> tuple[Backend, aiohttp.ClientWebSocketResponse] | None:
        """The backend with the most room and an open socket to its ``/ws``; None when full."""
        assert self._ws_client is not None
        pool = self.pool
        refused: set[Backend] = set()
        async for backend in self._placements(self.settings.ws_create_wait, refused):
            backend.opening += 1
            try:
                upstream = await self._ws_client.ws_connect(
                    f"http://{backend.address}{TUNNEL_ENDPOINT}",
                    headers={PLACEMENT_HEADER: "1"},
                    # aiohttp waits half of this for a pong: the pool's dead window, so a slow
                    # server keeps its sockets as long as its HTTP sessions; a silent one's
                    # sockets are ended by the pool when it finds the server dead.
                    heartbeat=2 * self.settings.dead_after_seconds,
                    autoping=True,
                    compress=0,
                    max_msg_size=0,
                )
            except aiohttp.WSServerHandshakeError as refused_upgrade:
                # Full, draining or not ready, though the last poll said otherwise: another
                # replica placed sessions there since, or clients reached it directly.
                if refused_upgrade.status == 503:
                    pool.mark_full(backend)
                else:
                    backend.errors += 1
                refused.add(backend)
                continue
            except (aiohttp.ClientError, OSError, TimeoutError):
                backend.errors += 1
                refused.add(backend)
                continue
            finally:
                backend.opening -= 1
            backend.unreported += 1
            backend.placed += 1
            return backend, upstream
        return None

    def _close_orphan(self, request: web.BaseRequest, backend: Backend, payload: bytes) -> None:
        try:
            session_id = json.loads(payload)["id"]
        except (ValueError, KeyError, TypeError):
            return
        body = json.dumps({"id": session_id}).encode()
        task = asyncio.create_task(self._forward(request, backend, b"POST", "/close", body))
        self._orphan_closes.add(task)
        task.add_done_callback(self._orphan_closed)
        self.metrics.orphans_closed += 1
        log.info(
            "closing session %s on %s: its client left during /create", session_id, backend.address
        )

    def _orphan_closed(self, task: asyncio.Task[Any]) -> None:
        self._orphan_closes.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("closing an orphaned session failed: %s", task.exception())

    async def _any_backend(self, request: web.BaseRequest) -> web.StreamResponse:
        """Pool-wide facts every env server answers alike (``ANY_BACKEND_ENDPOINTS``)."""
        backend = self.pool.any_ready()
        if backend is None:
            raise RoutingError(ErrorCode.AT_CAPACITY, "no env server in the pool is ready")
        try:
            status, payload, headers = await self._forward(
                request, backend, b"GET", request.raw_path, None
            )
        except BackendGone:
            raise RoutingError(
                ErrorCode.AT_CAPACITY, f"env server {backend.address} did not answer"
            ) from None
        return web.Response(body=payload, status=status, headers=headers)

    async def _healthz(self, request: web.BaseRequest) -> web.StreamResponse:
        return json_response(200, {"status": "ok"})

    async def _readyz(self, request: web.BaseRequest) -> web.StreamResponse:
        ready = self.pool.any_ready() is not None
        if ready:
            reason = "at least one env server takes sessions"
        elif self.settings.create_hold:
            reason = f"no ready env server; creates are held up to {self.settings.create_hold:g} s"
        else:
            reason = "no ready env server"
        ok = ready or bool(self.settings.create_hold)
        return json_response(200 if ok else 503, {"ready": ready, "reason": reason})

    async def _status(self, request: web.BaseRequest) -> web.StreamResponse:
        status = pool_status(self.pool)
        return web.Response(body=status.model_dump_json().encode(), content_type=JSON)

    async def _metrics_text(self, request: web.BaseRequest) -> web.StreamResponse:
        return web.Response(
            body=self.metrics.exposition(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )


def _error(error: RoutingError, retry_after: int) -> web.Response:
    headers = {"Retry-After": str(retry_after)} if error.code in RETRY_AFTER_CODES else None
    return json_response(ERROR_STATUS[error.code], error_body(error.code, error.message), headers)
