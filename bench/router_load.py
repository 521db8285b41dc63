"""bench/router.py's load generator: a lean keep-alive HTTP/1.1 client (a raw asyncio protocol,
one connection per session) and the sessions that step through a route in measured windows."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from measure import cpu_seconds
from router_harness import Proc

# -- a lean keep-alive HTTP/1.1 client ---------------------------------------------------------


def http_request(method: str, path: str, body: bytes = b"") -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


class Connection(asyncio.Protocol):
    """One keep-alive connection, one request at a time; responses need Content-Length.

    The load itself runs on callbacks (``send``): the next request goes out from inside
    ``data_received``, with no task switch per request, so the generator stays cheap.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._on_response: Callable[[int, bytes], None] | None = None
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, but have its methods.
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        callback, self._on_response = self._on_response, None
        if callback is not None:
            callback(0, b"connection closed")

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self._buffer[:end]).lower()
        at = head.find(b"content-length:")
        line_end = head.find(b"\r\n", at)
        length = int(head[at + 15 : line_end if line_end >= 0 else None])
        if len(self._buffer) < end + 4 + length:
            return
        body = bytes(self._buffer[end + 4 : end + 4 + length])
        del self._buffer[: end + 4 + length]
        callback, self._on_response = self._on_response, None
        assert callback is not None
        callback(int(head[9:12]), body)

    def send(self, request: bytes, on_response: Callable[[int, bytes], None]) -> None:
        assert self._transport is not None
        self._on_response = on_response
        self._transport.write(request)

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        answered: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        self.send(
            http_request(method, path, body),
            lambda status, reply: answered.set_result((status, reply)),
        )
        return await answered

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    async def json(self, method: str, path: str, payload: Any = None) -> Any:
        status, body = await self.request(method, path, json.dumps(payload).encode())
        if status != 200:
            raise RuntimeError(f"{method} {path} answered {status}: {body[:300]!r}")
        return json.loads(body)


async def connect(address: str) -> Connection:
    host, _, port = address.rpartition(":")
    _, connection = await asyncio.get_running_loop().create_connection(Connection, host, int(port))
    return connection


# -- sessions and load -------------------------------------------------------------------------


@dataclass
class Session:
    """A session created through the router, reachable through the router or directly."""

    routed_id: str
    backend_address: str
    backend_id: str
    data_idx: int


@dataclass(frozen=True)
class Route:
    """One way to reach a session: through a proxy process, or straight to its env server."""

    name: str
    proc: Proc | None = None
    routed: bool = False  # the proxy takes router session ids (else the server's own ids)

    def address(self, session: Session) -> str:
        return self.proc.address if self.proc is not None else session.backend_address

    def session_id(self, session: Session) -> str:
        return session.routed_id if self.routed else session.backend_id


@dataclass
class Window:
    requests: int = 0
    steps: int = 0
    step_latencies: list[float] = field(default_factory=list)
    cpu_seconds: float = 0.0


class Load:
    """Sessions stepping in a closed loop; each cycles through its own list of routes.

    Cycling per step (router, direct, router, ...) compares two routes on the same sessions at
    the same moments, so a shared, noisy machine weighs on both sides alike.
    """

    def __init__(self, sessions: list[Session], actions: list[str], think: float) -> None:
        self.sessions = sessions
        self.actions = actions
        self.think = think
        self.windows: dict[str, Window] | None = None
        self.stopping = False

    async def run(
        self, plans: list[list[Route]], seconds: float, warmup: float = 1.0
    ) -> dict[str, Window]:
        self.stopping = False
        drivers = [
            await SessionDriver.open(self, session, plan)
            for session, plan in zip(self.sessions, plans, strict=True)
        ]
        routes = {route.name: route for plan in plans for route in plan}
        pids = {
            name: route.proc.popen.pid
            for name, route in routes.items()
            if route.proc is not None and route.proc.popen is not None
        }
        for driver in drivers:
            driver.step()
        await asyncio.sleep(warmup)
        windows = {name: Window() for name in routes}
        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        self.windows = windows
        await asyncio.sleep(seconds)
        self.windows = None
        for name, pid in pids.items():
            windows[name].cpu_seconds = cpu_seconds(pid) - cpu_before[name]
        self.stopping = True
        await asyncio.gather(*(driver.finished for driver in drivers))
        return windows

    def count(self, route: str, step_latency: float | None) -> None:
        if self.windows is None:
            return
        window = self.windows[route]
        window.requests += 1
        if step_latency is not None:
            window.steps += 1
            window.step_latencies.append(step_latency)


class SessionDriver:
    """Steps one session in a closed loop on callbacks, cycling through its routes."""

    def __init__(
        self, load: Load, session: Session, plan: list[Route], connections: list[Connection]
    ) -> None:
        self._load = load
        self._plan = plan
        self._connections = connections
        self._steps = [
            [
                http_request(
                    "POST",
                    "/step",
                    json.dumps({"id": route.session_id(session), "action": action}).encode(),
                )
                for action in load.actions
            ]
            for route in plan
        ]
        self._resets = [
            http_request(
                "POST",
                "/reset",
                json.dumps(
                    {"id": route.session_id(session), "data_idx": session.data_idx}
                ).encode(),
            )
            for route in plan
        ]
        self._turn = 0
        self._which = 0
        self._sent = 0.0
        self._loop = asyncio.get_running_loop()
        self.finished: asyncio.Future[None] = self._loop.create_future()

    @classmethod
    async def open(cls, load: Load, session: Session, plan: list[Route]) -> SessionDriver:
        connections = [await connect(route.address(session)) for route in plan]
        return cls(load, session, plan, connections)

    def step(self) -> None:
        if self._load.stopping:
            for connection in self._connections:
                connection.close()
            self.finished.set_result(None)
            return
        self._which = self._turn % len(self._plan)
        actions = self._steps[self._which]
        request = actions[(self._turn // len(self._plan)) % len(actions)]
        self._turn += 1
        self._sent = time.perf_counter()
        self._connections[self._which].send(request, self._stepped)

    def _stepped(self, status: int, reply: bytes) -> None:
        took = time.perf_counter() - self._sent
        name = self._plan[self._which].name
        if status == 409:  # the episode ended on a step that went another way
            self._reset()
        elif status != 200:
            self._fail(f"{name} step answered {status}: {reply[:300]!r}")
        else:
            self._load.count(name, took)
            if b'"done":true' in reply:
                self._reset()
            else:
                self._next()

    def _reset(self) -> None:
        self._connections[self._which].send(self._resets[self._which], self._was_reset)

    def _was_reset(self, status: int, reply: bytes) -> None:
        if status != 200:
            self._fail(f"reset answered {status}: {reply[:300]!r}")
            return
        self._load.count(self._plan[self._which].name, None)
        self._next()

    def _next(self) -> None:
        if self._load.think:
            self._loop.call_later(self._load.think, self.step)
        else:
            self.step()

    def _fail(self, why: str) -> None:
        if not self.finished.done():
            self.finished.set_exception(RuntimeError(why))


async def open_sessions(router: Proc, count: int, data_idx: int | None = None) -> list[Session]:
    from gymkube_envserver.router.pool import token_address

    connection = await connect(router.address)
    sessions = []
    for index in range(count):
        routed_id = (await connection.json("POST", "/create", {}))["id"]
        token, _, backend_id = routed_id.partition(".")
        address = token_address(token)
        assert address is not None
        idx = index if data_idx is None else data_idx
        await connection.json("POST", "/reset", {"id": routed_id, "data_idx": idx})
        sessions.append(Session(routed_id, address, backend_id, idx))
    connection.close()
    return sessions


def merge(into: dict[str, Window], windows: dict[str, Window]) -> None:
    for name, window in windows.items():
        total = into.setdefault(name, Window())
        total.requests += window.requests
        total.steps += window.steps
        total.step_latencies += window.step_latencies
        total.cpu_seconds += window.cpu_seconds
