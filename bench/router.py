"""Session router: its own CPU per routed request, the latency it adds, and SciWorld throughput.

Starts real `gymkube-envserver` processes, `gymkube-router` and, for comparison, a plain aiohttp
pass-through proxy, then drives them from this process with a lean keep-alive HTTP client
(raw asyncio protocol on uvloop, one connection per session) so the load generator does not
starve the router of CPU. Sessions are created through the router; the direct route talks to
the env server holding a session with that server's own id. Comparisons run side by side at
the same moments: each session alternates routes step by step (cpu, latency), or half the
sessions take each route, swapped every round (sciworld). Prints one JSON document.

- cpu: CPU seconds per routed request (utime+stime from /proc/<pid>/stat over the window,
  divided by the requests answered) of the router and of the plain proxy, in front of one
  FrozenLake server at saturation (32 sessions, no think time). Target: router <= 150 us.
- cpu_router_bound: the same against a canned server that answers in a few µs, so the proxy
  itself is the bottleneck: the router's floor, without idle wake-ups.
- latency: 64 sessions stepping with 50 ms think time on two FrozenLake servers; per-step
  latency through the router minus direct. Targets: p50 <= 1 ms, p99 <= 3 ms.
  latency_8_sessions: the same with 8 sessions, the env servers far from busy.
- sciworld: steps/s through the router / direct on two ScienceWorld servers (env-bound).
  Target ratio >= 0.95.

    .venv/bin/python bench/router.py [--window 5] [--rounds 2] [--no-sciworld]

"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

import uvloop

SCRIPT = str(Path(__file__).resolve())
REPO_ROOT = Path(SCRIPT).parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests" / "unit" / "router"))

from router_harness import Proc, Procs, wait_all  # noqa: E402
from sections import finish, run_async_section  # noqa: E402

TARGET_CPU_US = 150.0
TARGET_ADDED_P50_MS = 1.0
TARGET_ADDED_P99_MS = 3.0
TARGET_SCIWORLD_RATIO = 0.95
FROZEN_LAKE_MOVES = [f"<action>{m}</action>" for m in ("right", "down", "left", "down", "up")]


# -- the plain pass-through proxy we compare against ------------------------------------------


def naive_proxy(argv: list[str]) -> None:
    """A first aiohttp proxy: forward method, path, query and body to one backend."""
    import aiohttp
    from aiohttp import web

    parser = argparse.ArgumentParser(prog="naive-proxy")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    base = f"http://{args.backend}"

    async def forward(request: web.Request) -> web.Response:
        body = await request.read()
        session: aiohttp.ClientSession = request.app["http"]
        async with session.request(
            request.method,
            base + request.path_qs,
            data=body,
            headers={"Content-Type": "application/json"},
        ) as response:
            return web.Response(
                body=await response.read(),
                status=response.status,
                content_type="application/json",
            )

    async def client_session(app: web.Application) -> Any:
        app["http"] = aiohttp.ClientSession()
        yield
        await app["http"].close()

    async def readyz(request: web.Request) -> web.Response:
        return web.json_response({"ready": True})

    app = web.Application()
    app.router.add_get("/readyz", readyz)
    app.router.add_route("*", "/{path:.*}", forward)
    app.cleanup_ctx.append(client_session)
    web.run_app(
        app,
        host=args.host,
        port=args.port,
        print=None,
        access_log=None,
        loop=uvloop.new_event_loop(),
    )


# -- a canned env server, to find the router's own floor --------------------------------------


def _canned(body: dict[str, Any]) -> bytes:
    payload = json.dumps(body).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(payload),
        payload,
    )


_CANNED = {
    b"/step": _canned(
        {
            "observation": "You moved up.\nF F H F\nF P F F",
            "reward": 0.0,
            "score": 0.0,
            "done": False,
            "info": {},
        }
    ),
    b"/status": _canned(
        {
            "env": "canned",
            "active": 0,
            "capacity": 10_000,
            "warm": 0,
            "warm_target": 0,
            "draining": False,
            "served": 0,
            "ready": True,
            "canary": {},
        }
    ),
    # /reset and /readyz
    b"": _canned(
        {
            "id": "s0",
            "observation": "start",
            "task_description": "canned",
            "reward": 0.0,
            "score": 0.0,
            "done": False,
            "ready": True,
        }
    ),
}


class CannedServer(asyncio.Protocol):
    """Answers the env protocol with fixed bodies at a few µs per request.

    Not an env: it only lets the router, not the env server, be the bottleneck, so the
    router's own CPU per request shows without scheduler wake-ups between idle periods.
    """

    created = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._buffer = b""

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while (end := self._buffer.find(b"\r\n\r\n")) >= 0:
            head = self._buffer[:end].lower()
            at = head.find(b"content-length:")
            length = int(head[at + 15 :].split(b"\r\n")[0]) if at >= 0 else 0
            if len(self._buffer) < end + 4 + length:
                return
            self._buffer = self._buffer[end + 4 + length :]
            path = head.split(b" ", 2)[1]
            if path == b"/create":
                CannedServer.created += 1
                self._transport.write(_canned({"id": f"s{CannedServer.created}"}))
            else:
                self._transport.write(_CANNED.get(path, _CANNED[b""]))


def canned_server(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="canned-server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(CannedServer, args.host, args.port)
        await server.serve_forever()

    uvloop.run(serve())


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


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 10) - 1]


def merge(into: dict[str, Window], windows: dict[str, Window]) -> None:
    for name, window in windows.items():
        total = into.setdefault(name, Window())
        total.requests += window.requests
        total.steps += window.steps
        total.step_latencies += window.step_latencies
        total.cpu_seconds += window.cpu_seconds


# -- the three measurements --------------------------------------------------------------------


async def bench_cpu(procs: Procs, window: float, rounds: int) -> dict[str, Any]:
    backend = procs.env_server(max_sessions=64, warm=4)
    router = procs.router_for([backend], fast_polling=False)
    plain = procs.start(
        Proc(
            "plain aiohttp proxy",
            [SCRIPT, "naive-proxy", "--backend", backend.address],
            launcher=[],
        )
    )
    wait_all(backend, router, plain)
    sessions = await open_sessions(router, 32)
    load = Load(sessions, FROZEN_LAKE_MOVES, think=0.0)
    plan = [Route("router", router, routed=True), Route("plain_aiohttp_proxy", plain)]
    totals: dict[str, Window] = {}
    for _ in range(rounds):
        merge(totals, await load.run([plan] * len(sessions), window))
    summary = {
        name: {
            "cpu_us_per_request": total.cpu_seconds / max(total.requests, 1) * 1e6,
            "requests_per_s": total.requests / (window * rounds),
        }
        for name, total in totals.items()
    }
    router_us = summary["router"]["cpu_us_per_request"]
    return {
        "setup": "1 FrozenLake server, 32 sessions without think time, each step alternating "
        "router / plain proxy",
        **summary,
        "router_vs_plain_proxy": router_us / summary["plain_aiohttp_proxy"]["cpu_us_per_request"],
        "target_us": TARGET_CPU_US,
        "meets_target": router_us <= TARGET_CPU_US,
    }


async def bench_cpu_router_bound(procs: Procs, window: float, rounds: int) -> dict[str, Any]:
    backend = procs.start(Proc("canned env server", [SCRIPT, "canned-server"], launcher=[]))
    backend.wait_ready()
    router = procs.router_for([backend], fast_polling=False)
    plain = procs.start(
        Proc(
            "plain aiohttp proxy",
            [SCRIPT, "naive-proxy", "--backend", backend.address],
            launcher=[],
        )
    )
    wait_all(router, plain)
    sessions = await open_sessions(router, 32)
    load = Load(sessions, FROZEN_LAKE_MOVES, think=0.0)
    summary = {}
    for route in (Route("router", router, routed=True), Route("plain_aiohttp_proxy", plain)):
        totals: dict[str, Window] = {}
        for _ in range(rounds):
            merge(totals, await load.run([[route]] * len(sessions), window))
        total = totals[route.name]
        summary[route.name] = {
            "cpu_us_per_request": total.cpu_seconds / max(total.requests, 1) * 1e6,
            "requests_per_s": total.requests / (window * rounds),
        }
    return {
        "setup": "a canned env server (fixed answers), 32 sessions without think time, one "
        "proxy at a time: the proxy is the bottleneck",
        **summary,
        "router_vs_plain_proxy": summary["router"]["cpu_us_per_request"]
        / summary["plain_aiohttp_proxy"]["cpu_us_per_request"],
    }


async def bench_latency(
    procs: Procs, window: float, rounds: int, sessions_count: int = 64
) -> dict[str, Any]:
    backends = [procs.env_server(max_sessions=40, warm=4) for _ in range(2)]
    router = procs.router_for(backends, fast_polling=False)
    wait_all(*backends, router)
    sessions = await open_sessions(router, sessions_count)
    load = Load(sessions, FROZEN_LAKE_MOVES, think=0.05)
    plan = [Route("router", router, routed=True), Route("direct")]
    totals: dict[str, Window] = {}
    for _ in range(rounds):
        merge(totals, await load.run([plan] * len(sessions), window))
    direct, routed = totals["direct"].step_latencies, totals["router"].step_latencies
    result: dict[str, Any] = {
        "setup": f"2 FrozenLake servers, {sessions_count} sessions, 50 ms think time, each step "
        "alternating router / direct",
        "samples": {"direct": len(direct), "router": len(routed)},
    }
    for name, q in (("p50", 50), ("p99", 99)):
        direct_ms, routed_ms = percentile(direct, q) * 1e3, percentile(routed, q) * 1e3
        result[name] = {
            "direct_ms": direct_ms,
            "router_ms": routed_ms,
            "added_ms": routed_ms - direct_ms,
        }
    result["inside_router_ms"] = await inside_router_quantiles(router)
    result["targets_ms"] = {"p50": TARGET_ADDED_P50_MS, "p99": TARGET_ADDED_P99_MS}
    result["meets_target"] = (
        result["p50"]["added_ms"] <= TARGET_ADDED_P50_MS
        and result["p99"]["added_ms"] <= TARGET_ADDED_P99_MS
    )
    return result


async def inside_router_quantiles(router: Proc) -> dict[str, float]:
    """p50/p99 of the router's own added-latency histogram for /step (bucket upper bounds)."""
    connection = await connect(router.address)
    _, text = await connection.request("GET", "/metrics")
    connection.close()
    prefix = 'gymkube_router_added_latency_seconds_bucket{endpoint="/step",le="'
    buckets = [
        (float(line[len(prefix) :].split('"')[0]), float(line.rsplit(" ", 1)[1]))
        for line in text.decode().splitlines()
        if line.startswith(prefix)
    ]
    total = buckets[-1][1]
    return {
        f"p{q}_at_most": next(bound for bound, count in buckets if count >= total * q / 100) * 1e3
        for q in (50, 99)
    }


async def bench_sciworld(procs: Procs, window: float, rounds: int) -> dict[str, Any]:
    per_backend = 4
    backends = [
        procs.env_server(max_sessions=per_backend, warm=per_backend, env="sciworld")
        for _ in range(2)
    ]
    router = procs.router_for(backends, fast_polling=False)
    wait_all(*backends, router)
    # One task for every session, so the two halves do the same work.
    sessions = await open_sessions(router, 2 * per_backend, data_idx=0)
    load = Load(sessions, ["look around", "inventory"], think=0.0)
    routed, direct = Route("router", router, routed=True), Route("direct")
    totals: dict[str, Window] = {}
    for turn in range(rounds):
        # Half the sessions of each server go through the router, half direct; swapped each
        # round so no session's speed favours one side.
        plans = [[routed if (i + turn) % 2 else direct] for i in range(len(sessions))]
        merge(totals, await load.run(plans, window))
    router_rate = totals["router"].steps / (window * rounds)
    direct_rate = totals["direct"].steps / (window * rounds)
    ratio = router_rate / direct_rate
    return {
        "setup": f"2 ScienceWorld servers, {len(sessions)} sessions without think time, half "
        "through the router, half direct, at the same time",
        "direct_steps_per_s": direct_rate,
        "router_steps_per_s": router_rate,
        "ratio": ratio,
        "target_ratio": TARGET_SCIWORLD_RATIO,
        "meets_target": ratio >= TARGET_SCIWORLD_RATIO,
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "load_avg_1m_at_start": os.getloadavg()[0]},
        "window_s": args.window,
        "rounds": args.rounds,
    }
    benches: list[tuple[str, Callable[[Procs, float, int], Awaitable[dict[str, Any]]]]] = [
        ("cpu", bench_cpu),
        ("cpu_router_bound", bench_cpu_router_bound),
        ("latency", bench_latency),
        # The same with the env servers far from busy: what one more hop costs on its own.
        ("latency_8_sessions", partial(bench_latency, sessions_count=8)),
    ]
    if args.sciworld:
        benches.append(("sciworld", bench_sciworld))
    for name, run in benches:
        procs = Procs()
        window = args.window * (3 if name == "sciworld" else 1)
        try:
            await run_async_section(result, name, partial(run, procs, window, args.rounds))
        finally:
            procs.stop_all()
    return result


def main() -> None:
    if sys.argv[1:2] == ["naive-proxy"]:
        naive_proxy(sys.argv[2:])
        return
    if sys.argv[1:2] == ["canned-server"]:
        canned_server(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--window", type=float, default=5.0, help="seconds per measured window")
    parser.add_argument("--rounds", type=int, default=2, help="alternating windows per side")
    parser.add_argument("--no-sciworld", dest="sciworld", action="store_false")
    args = parser.parse_args()
    finish(uvloop.run(bench(args)))


if __name__ == "__main__":
    main()
