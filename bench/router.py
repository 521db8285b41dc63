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
- creates: a trainer opening its batch: 32 clients at once, each creating a FrozenLake session
  and closing it again, through the router or straight at the one env server in alternating
  windows; creates/s and create latency p50/p99 by route, and the CPU per create+close of the
  router and the server. Targets through the router: >= 1,000 creates/s, p99 <= 100 ms.

    .venv/bin/python bench/router.py [--window 5] [--rounds 2] [--no-sciworld] [--only creates]

"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import uvloop

SCRIPT = str(Path(__file__).resolve())
REPO_ROOT = Path(SCRIPT).parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests" / "unit" / "router"))

from measure import cpu_seconds, percentile  # noqa: E402
from router_harness import Proc, Procs, wait_all  # noqa: E402
from router_load import Load, Route, Window, connect, merge, open_sessions  # noqa: E402
from sections import finish, run_async_section  # noqa: E402

PEERS = str(Path(SCRIPT).with_name("router_peers.py"))

TARGET_CPU_US = 150.0
TARGET_ADDED_P50_MS = 1.0
TARGET_ADDED_P99_MS = 3.0
TARGET_SCIWORLD_RATIO = 0.95
TARGET_CREATES_PER_S = 1000.0
TARGET_CREATE_P99_MS = 100.0
FROZEN_LAKE_MOVES = [f"<action>{m}</action>" for m in ("right", "down", "left", "down", "up")]


# -- the three measurements --------------------------------------------------------------------


async def bench_cpu(procs: Procs, window: float, rounds: int) -> dict[str, Any]:
    backend = procs.env_server(max_sessions=64, warm=4)
    router = procs.router_for([backend], fast_polling=False)
    plain = procs.start(
        Proc(
            "plain aiohttp proxy",
            [PEERS, "naive-proxy", "--backend", backend.address],
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
    backend = procs.start(Proc("canned env server", [PEERS, "canned-server"], launcher=[]))
    backend.wait_ready()
    router = procs.router_for([backend], fast_polling=False)
    plain = procs.start(
        Proc(
            "plain aiohttp proxy",
            [PEERS, "naive-proxy", "--backend", backend.address],
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


async def bench_creates(
    procs: Procs, window: float, rounds: int, clients: int = 32
) -> dict[str, Any]:
    backend = procs.env_server(max_sessions=2 * clients, warm=clients)
    router = procs.router_for([backend], fast_polling=False)
    wait_all(backend, router)
    pids = {"router": router.popen.pid, "env_server": backend.popen.pid}  # type: ignore[union-attr]
    latencies: dict[str, list[float]] = {"router": [], "direct": []}
    failures: dict[str, int] = {"router": 0, "direct": 0}
    cpu = {route: dict.fromkeys(pids, 0.0) for route in latencies}
    measuring = False

    async def client(route: str, deadline: float) -> None:
        connection = await connect(router.address if route == "router" else backend.address)
        try:
            while time.monotonic() < deadline:
                started = time.perf_counter()
                status, reply = await connection.request("POST", "/create", b"{}")
                took = time.perf_counter() - started
                if status != 200:
                    failures[route] += measuring
                    continue
                if measuring:
                    latencies[route].append(took)
                closing = json.dumps({"id": json.loads(reply)["id"]}).encode()
                await connection.request("POST", "/close", closing)
        finally:
            connection.close()

    for _ in range(rounds):
        # One route at a time, alternating: the router's creates need the server's CPU too.
        for route in latencies:
            warmup = 1.0
            deadline = time.monotonic() + warmup + window
            running = asyncio.gather(*(client(route, deadline) for _ in range(clients)))
            await asyncio.sleep(warmup)
            measuring = True
            before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            await asyncio.sleep(window)
            measuring = False
            for name, pid in pids.items():
                cpu[route][name] += cpu_seconds(pid) - before[name]
            await running
    measured = window * rounds
    result: dict[str, Any] = {
        "setup": f"1 FrozenLake server, {clients} clients creating and closing sessions without "
        "pause, through the router or straight at the server, in alternating windows",
    }
    for route, seen in latencies.items():
        result[route] = {
            "creates_per_s": len(seen) / measured,
            "p50_ms": percentile(seen, 50) * 1e3,
            "p99_ms": percentile(seen, 99) * 1e3,
            "failed": failures[route],
            "cpu_us_per_create_and_close": {
                name: seconds / max(len(seen), 1) * 1e6
                for name, seconds in cpu[route].items()
                if route == "router" or name == "env_server"
            },
        }
    routed = result["router"]
    result["router_vs_direct_creates_per_s"] = (
        routed["creates_per_s"] / result["direct"]["creates_per_s"]
    )
    result["targets"] = {"creates_per_s": TARGET_CREATES_PER_S, "p99_ms": TARGET_CREATE_P99_MS}
    result["meets_target"] = (
        routed["creates_per_s"] >= TARGET_CREATES_PER_S and routed["p99_ms"] <= TARGET_CREATE_P99_MS
    )
    return result


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
    benches.append(("creates", bench_creates))
    if args.only:
        benches = [(name, run) for name, run in benches if name in args.only]
    for name, run in benches:
        procs = Procs()
        window = args.window * (3 if name == "sciworld" else 1)
        try:
            await run_async_section(result, name, partial(run, procs, window, args.rounds))
        finally:
            procs.stop_all()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--window", type=float, default=5.0, help="seconds per measured window")
    parser.add_argument("--rounds", type=int, default=2, help="alternating windows per side")
    parser.add_argument("--no-sciworld", dest="sciworld", action="store_false")
    parser.add_argument("--only", nargs="+", help="run only these sections")
    args = parser.parse_args()
    finish(uvloop.run(bench(args)))


if __name__ == "__main__":
    main()
