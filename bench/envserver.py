"""Env-server benchmarks, measured side by side in one run; prints JSON.

    .venv/bin/python bench/envserver.py [--quick] [--jvm-flags]

- create_reset: ScienceWorld /create + /reset p50 from a warm pool versus cold (``--warm 0``: a new
  JVM per /create, as AgentGym's server does), cold also with JVM default flags (AgentGym's setup).
  Target: warm at least 20x faster than cold.
- sciworld_step: one ScienceWorld step over HTTP versus ``env.step`` in-process, the two
  interleaved on identical action sequences. Target: at most 1.2x (at most 5 ms added at p50).
- frozen_lake: steps/s with 64 concurrent sessions on one server process (client in another
  process, keep-alive connections). Target: at least 2,000 steps/s.
- batch_pattern: what a GRPO rollout does for days: rounds of ``--batch-sessions`` concurrent
  ScienceWorld episodes (create, reset, 3 steps, close) against (a) gymkube with env reuse, (b)
  gymkube with ``--reuse false``, (c) AgentGym's model (``--warm 0 --reuse false``, JVM default
  flags: a new JVM per /create), the three round by round on a settled box, plus the same episodes'
  steps on warmed in-process envs at the same concurrency. (a) then plays on to 50 rounds for its
  memory. Targets for rounds after the first, with reuse: create p50 <= 5 ms, reset p50 <= 100 ms,
  step p50 <= 1.2x in-process, batch wall time >= 10x better than (c); server memory after 50
  rounds <= 1.3x after round 1.
- jvm_flags (``--jvm-flags``): JVM start, reset and step times (before and after the warm-pool
  warm-up), warm-up cost and RSS per candidate flag set,
  the measurement behind the server's default ``--jvm-options``.

Every server is a real ``gymkube-envserver`` process on 127.0.0.1; all are stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from gymkube_dev.ports import free_port
from gymkube_envserver.envs.sciworld import jvm_tool_options
from gymkube_envserver.settings import DEFAULT_JVM_OPTIONS
from sections import finish, run_section

CLI = str(Path(sys.executable).with_name("gymkube-envserver"))
NO_REUSE = ("--reuse", "false")
RESET_INDICES = [0, 500, 1200, 2100, 3000, 3800, 4400, 250, 1700, 2600, 3300, 4000]
STEP_ACTIONS = ["look around", "inventory", "look at agent", "wait1", "task", "look around"]
FROZEN_MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
SERVER_JVM_OPTIONS = jvm_tool_options(DEFAULT_JVM_OPTIONS, None)
"""What a server's JVMs run with by default: --jvm-options plus the constant identity hash."""
JVM_CANDIDATES = {
    "jvm_defaults": "",
    "serial_gc": "-XX:+UseSerialGC",
    "serial_gc_c1": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
    "gymkube_default_c1_only": f"{DEFAULT_JVM_OPTIONS} -XX:TieredStopAtLevel=1",
    "gymkube_default_varying_hash": DEFAULT_JVM_OPTIONS,
    "gymkube_default_xmx512m": jvm_tool_options(
        DEFAULT_JVM_OPTIONS.replace("-Xmx256m", "-Xmx512m"), None
    ),
    "gymkube_default": SERVER_JVM_OPTIONS,
}
BATCH_STEPS = STEP_ACTIONS[:3]


def p50(values: list[float]) -> float:
    return round(statistics.median(values), 2)


@contextmanager
def envserver(*args: str, jvm_options: str | None = None) -> Iterator[tuple[str, int]]:
    """A gymkube-envserver process; yields its URL and pid once /readyz answers 200."""
    port = free_port()
    env = dict(os.environ)
    env.pop("JAVA_TOOL_OPTIONS", None)
    if jvm_options is not None:
        env["GYMKUBE_JVM_OPTIONS"] = jvm_options
    command = [CLI, "--host", "127.0.0.1", "--port", str(port), "--canary-interval", "0", *args]
    server = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"{' '.join(command)} exited with {server.returncode}")
            try:
                if httpx.get(f"{url}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} not ready")
            time.sleep(0.1)
        yield url, server.pid
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def wait_warm(client: httpx.Client, target: int) -> None:
    """Wait until the warm pool is full."""
    deadline = time.monotonic() + 300
    while client.get("/status").json()["warm"] < target:
        if time.monotonic() > deadline:
            raise TimeoutError("warm pool did not refill")
        time.sleep(0.05)


def process_tree(pid: int) -> list[int]:
    """A process and all of its descendants (a server and its JVMs)."""
    tree, index = [pid], 0
    while index < len(tree):
        for task in Path(f"/proc/{tree[index]}/task").glob("*/children"):
            with suppress(OSError):  # the thread or process just exited
                tree.extend(int(child) for child in task.read_text().split())
        index += 1
    return tree


def tree_cpu_seconds(pid: int) -> float:
    total = 0.0
    for member in process_tree(pid):
        with suppress(OSError):
            total += cpu_seconds(member)
    return total


def settle(pids: list[int], window_s: float = 0.3, idle_share: float = 0.05) -> None:
    """Wait until no server (nor its JVMs) is busy: refills, JIT compiles and JVM exits done.

    Each sample then measures its own request, not the background work a previous one left.
    """
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        before = [tree_cpu_seconds(pid) for pid in pids]
        time.sleep(window_s)
        after = [tree_cpu_seconds(pid) for pid in pids]
        if all(
            end - start < idle_share * window_s for start, end in zip(before, after, strict=True)
        ):
            return
    raise TimeoutError("the servers did not settle")


def create_reset_ms(client: httpx.Client, data_idx: int) -> float:
    began = time.perf_counter()
    session = client.post("/create").raise_for_status().json()["id"]
    client.post("/reset", json={"id": session, "data_idx": data_idx}).raise_for_status()
    elapsed = (time.perf_counter() - began) * 1000
    client.post("/close", json={"id": session})
    return elapsed


def bench_create_reset(samples: int) -> dict[str, Any]:
    indices = RESET_INDICES[:samples]
    results: dict[str, list[float]] = {"warm": [], "cold": [], "cold_jvm_defaults": []}
    servers = {
        "warm": (("--env", "sciworld", "--warm", "1", "--max-sessions", "2"), None),
        "cold": (("--env", "sciworld", "--warm", "0", "--max-sessions", "2", *NO_REUSE), None),
        "cold_jvm_defaults": (
            ("--env", "sciworld", "--warm", "0", "--max-sessions", "2", *NO_REUSE),
            "",
        ),
    }
    with (
        envserver(*servers["warm"][0]) as (warm_url, warm_pid),
        envserver(*servers["cold"][0]) as (cold_url, cold_pid),
        envserver(*servers["cold_jvm_defaults"][0], jvm_options="") as (default_url, default_pid),
    ):
        urls = {"warm": warm_url, "cold": cold_url, "cold_jvm_defaults": default_url}
        clients = {name: httpx.Client(base_url=url, timeout=300) for name, url in urls.items()}
        for data_idx in indices:
            # Round-robin, each sample on a settled box, so all three see the same conditions.
            for name, client in clients.items():
                wait_warm(clients["warm"], 1)
                settle([warm_pid, cold_pid, default_pid])
                results[name].append(create_reset_ms(client, data_idx))
        for client in clients.values():
            client.close()
    warm, cold, default = (p50(results[name]) for name in ("warm", "cold", "cold_jvm_defaults"))
    return {
        "samples": len(indices),
        "warm_p50_ms": warm,
        "cold_p50_ms": cold,
        "cold_jvm_defaults_p50_ms": default,
        "speedup_vs_cold": round(cold / warm, 1),
        "speedup_vs_cold_jvm_defaults": round(default / warm, 1),
        "target_speedup": 20,
        "raw_ms": {name: [round(value) for value in values] for name, values in results.items()},
    }


def bench_sciworld_step(steps: int, pairs: int) -> dict[str, Any]:
    """HTTP vs in-process steps on ``pairs`` pairs of equally warmed JVMs.

    Two JVMs with the same history still JIT-compile differently (a few ms per step either
    way), so the samples come from several pairs, each a new server session and a new
    in-process env, both warmed up and stepped through the actions once before measuring.
    """
    os.environ["JAVA_TOOL_OPTIONS"] = SERVER_JVM_OPTIONS  # same JVM flags as the server's
    from scienceworld import ScienceWorldEnv

    data_idx = 1200
    http_ms: list[float] = []
    local_ms: list[float] = []
    with envserver("--env", "sciworld", "--warm", "1", "--max-sessions", "2") as (url, pid):
        client = httpx.Client(base_url=url, timeout=300)
        table = client.get("/tasks").json()
        task = next(
            t for t in table["tasks"] if t["first_idx"] <= data_idx < t["first_idx"] + t["count"]
        )
        for _ in range(pairs):
            wait_warm(client, 1)
            session = client.post("/create").json()["id"]
            client.post("/reset", json={"id": session, "data_idx": data_idx}).raise_for_status()
            env = ScienceWorldEnv()
            warm_up_like_the_server(env)  # as warm as the server's env: they differ by HTTP only
            env.load(task["name"], data_idx - task["first_idx"])
            env.step("look around")
            for action in STEP_ACTIONS:
                env.step(action)
                client.post("/step", json={"id": session, "action": action}).raise_for_status()
            wait_warm(client, 1)
            settle([pid, os.getpid()])  # the pool's refill and both JVMs' JIT compiles are done
            for count in range(steps // pairs):
                action = STEP_ACTIONS[count % len(STEP_ACTIONS)]
                began = time.perf_counter()
                env.step(action)
                local_ms.append((time.perf_counter() - began) * 1000)
                began = time.perf_counter()
                client.post("/step", json={"id": session, "action": action}).raise_for_status()
                http_ms.append((time.perf_counter() - began) * 1000)
            client.post("/close", json={"id": session})
            env.close()
        client.close()
    http, local = p50(http_ms), p50(local_ms)
    return {
        "steps": len(http_ms),
        "jvm_pairs": pairs,
        "http_p50_ms": http,
        "in_process_p50_ms": local,
        "ratio_p50": round(http / local, 3),
        "added_ms_p50": round(http - local, 2),
        "target_ratio": 1.2,
        "target_added_ms": 5,
    }


def safe_neighbour(observation: str) -> tuple[str, str]:
    """Two moves that step off the start onto ice and back (never a hole, never the goal)."""
    grid = [
        line.split(" ")
        for line in observation.splitlines()
        if line and all(cell in {"S", "F", "H", "G", "P"} for cell in line.split(" "))
    ]
    size = len(grid)
    row, col = next((r, c) for r in range(size) for c in range(size) if grid[r][c] == "P")
    back = {"up": "down", "down": "up", "left": "right", "right": "left"}
    for move, (d_row, d_col) in FROZEN_MOVES.items():
        r, c = row + d_row, col + d_col
        if 0 <= r < size and 0 <= c < size and grid[r][c] == "F":
            return move, back[move]
    # Start is boxed in by the edge: bumping into it is a safe no-op move.
    edge = next(
        move
        for move, (d_row, d_col) in FROZEN_MOVES.items()
        if not (0 <= row + d_row < size and 0 <= col + d_col < size)
    )
    return edge, edge


async def frozen_lake_client(
    url: str, server_pid: int, sessions: int, duration_s: float
) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=sessions)
    steps = 0
    errors = 0
    counting = False

    async with aiohttp.ClientSession(url, connector=connector) as http:

        async def new_episode(seed: int) -> tuple[str, tuple[str, str]]:
            async with http.post("/create", json={"env_config": {"max_steps": 1000}}) as r:
                session = (await r.json())["id"]
            async with http.post("/reset", json={"id": session, "seed": seed}) as r:
                first = await r.json()
            return session, safe_neighbour(first["observation"])

        async def run(worker: int, stop_at: float) -> None:
            nonlocal steps, errors
            session, moves = await new_episode(worker)
            turn = 0
            while time.perf_counter() < stop_at:
                action = f"<action>{moves[turn % 2]}</action>"
                turn += 1
                async with http.post("/step", json={"id": session, "action": action}) as r:
                    body = await r.json()
                    if r.status != 200:
                        errors += 1
                        continue
                if counting:
                    steps += 1
                if body["done"]:
                    await http.post("/close", json={"id": session})
                    session, moves = await new_episode(worker + turn)
                    turn = 0

        warmup_s = 1.0
        began = time.perf_counter()
        stop_at = began + warmup_s + duration_s
        tasks = [asyncio.create_task(run(worker, stop_at)) for worker in range(sessions)]
        await asyncio.sleep(warmup_s)
        counting = True
        counted_from = time.perf_counter()
        cpu_from = cpu_seconds(server_pid)
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - counted_from
        server_cpu_s = cpu_seconds(server_pid) - cpu_from
    return {
        "steps": steps,
        "seconds": round(elapsed, 2),
        "errors": errors,
        "server_cpu_us_per_step": round(server_cpu_s / max(steps, 1) * 1e6),
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_frozen_lake(sessions: int, duration_s: float) -> dict[str, Any]:
    with envserver(
        "--env",
        "frozen_lake",
        "--warm",
        "0",
        "--max-sessions",
        str(sessions * 2),
        "--log-level",
        "warning",
    ) as (url, pid):
        result = asyncio.run(frozen_lake_client(url, pid, sessions, duration_s))
    return {
        "sessions": sessions,
        "steps_per_s": round(result["steps"] / result["seconds"]),
        **result,
        # What the server process could do with a core to itself, whatever else the box runs.
        "server_steps_per_cpu_second": round(1e6 / max(result["server_cpu_us_per_step"], 1)),
        "target_steps_per_s": 2000,
    }


def warm_up_like_the_server(env: Any) -> int:
    """The warm-pool warm-up on an in-process env: the server's plan, a reset and a step each."""
    from gymkube_envserver.envs.sciworld import SKIPPED_TASK_IDS, warm_up_plan
    from gymkube_envserver.settings import ServerSettings

    names = [name for task_id, name in env.tasks.items() if task_id not in SKIPPED_TASK_IDS]
    variations = [int(env.get_max_variations(name)) for name in names]
    loads: int = ServerSettings.model_fields["warm_up_resets"].default
    for task, variation in warm_up_plan(names, variations, loads):
        env.load(task, variation)
        env.get_task_description()
        env.step("look around")
    return loads


def probe_jvm() -> dict[str, float]:
    """One JVM under this process's JAVA_TOOL_OPTIONS, through the life a warm-pool JVM has.

    Start, first reset, the server's default warm-up (a reset and a step per load, through every
    task), then a reset and an episode's steps after it; CPU seconds of the JVM and its RSS.
    """
    from scienceworld import ScienceWorldEnv

    def jvm_cpu_s() -> float:
        return cpu_seconds(env._gateway.java_process.pid)

    def reset_ms(task: str, variation: int) -> float:
        began = time.perf_counter()
        env.load(task, variation)
        env.get_task_description()
        env.step("look around")
        return (time.perf_counter() - began) * 1000

    began = time.perf_counter()
    env = ScienceWorldEnv()
    start_ms = (time.perf_counter() - began) * 1000
    start_cpu_s = jvm_cpu_s()
    first_reset_ms = reset_ms("boil", 0)
    began, cpu_before = time.perf_counter(), jvm_cpu_s()
    loads = warm_up_like_the_server(env)
    warm_up_ms = (time.perf_counter() - began) * 1000
    warm_up_cpu_s = jvm_cpu_s() - cpu_before
    time.sleep(1.0)  # let JIT compiles queued by the warm-up finish, as in an idle pool
    resets = [
        reset_ms(task, variation)
        for task, variation in [("chemistry-mix", 3), ("find-animal", 5), ("melt", 7)]
    ]
    steps = []
    for action in STEP_ACTIONS * 5:
        began = time.perf_counter()
        env.step(action)
        steps.append((time.perf_counter() - began) * 1000)
    status = Path(f"/proc/{env._gateway.java_process.pid}/status").read_text()
    rss_kb = int(status.split("VmRSS:")[1].split()[0])
    env.close()
    return {
        "start_ms": start_ms,
        "start_cpu_s": start_cpu_s,
        "first_reset_ms": first_reset_ms,
        f"warm_up_{loads}_ms": warm_up_ms,
        f"warm_up_{loads}_cpu_s": warm_up_cpu_s,
        "reset_after_warm_up_ms": statistics.median(resets),
        "step_after_warm_up_ms": statistics.median(steps),
        "jvm_rss_mb": rss_kb / 1024,
    }


def bench_jvm_flags(rounds: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in JVM_CANDIDATES}
    for _ in range(rounds):
        for name, options in JVM_CANDIDATES.items():
            env = dict(os.environ)
            env.pop("JAVA_TOOL_OPTIONS", None)
            if options:
                env["JAVA_TOOL_OPTIONS"] = options
            done = subprocess.run(
                [sys.executable, __file__, "--probe-jvm"],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
                check=True,
            )
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {
        name: {"options": JVM_CANDIDATES[name]}
        | {key: p50([run[key] for run in values]) for key in values[0]}
        for name, values in runs.items()
    }


def tree_rss_mib(pid: int) -> float:
    """Resident memory of a server and its JVMs together."""
    total_kb = 0
    for member in process_tree(pid):
        with suppress(OSError, IndexError):
            status = Path(f"/proc/{member}/status").read_text()
            total_kb += int(status.split("VmRSS:")[1].split()[0])
    return round(total_kb / 1024, 1)


async def batch_round(http: httpx.AsyncClient, data_indices: list[int]) -> dict[str, Any]:
    """One rollout batch: an episode per data_idx, all at once; per-call latencies and wall time.

    ``http`` lives across rounds, as a trainer's client does (keep-alive connections)."""
    calls: dict[str, list[float]] = {"create": [], "reset": [], "step": []}

    async def timed(name: str, call: Any) -> Any:
        began = time.perf_counter()
        response = (await call).raise_for_status()
        calls[name].append((time.perf_counter() - began) * 1000)
        return response.json()

    async def episode(http: httpx.AsyncClient, data_idx: int) -> None:
        session = (await timed("create", http.post("/create")))["id"]
        await timed("reset", http.post("/reset", json={"id": session, "data_idx": data_idx}))
        for action in BATCH_STEPS:
            await timed("step", http.post("/step", json={"id": session, "action": action}))
        (await http.post("/close", json={"id": session})).raise_for_status()

    began = time.perf_counter()
    await asyncio.gather(*(episode(http, data_idx) for data_idx in data_indices))
    wall_ms = (time.perf_counter() - began) * 1000
    return {"wall_ms": wall_ms, **calls}


def in_process_round(
    envs: list[Any], entries: list[tuple[str, int]]
) -> tuple[list[float], list[float]]:
    """The batch's episodes on warmed in-process envs, one thread each: reset (the server's: load,
    task description, look around) and step latencies in ms."""

    def episode(env: Any, task: str, variation: int) -> tuple[float, list[float]]:
        began = time.perf_counter()
        env.load(task, variation)
        env.get_task_description()
        env.step("look around")
        reset_ms = (time.perf_counter() - began) * 1000
        latencies = []
        for action in BATCH_STEPS:
            began = time.perf_counter()
            env.step(action)
            latencies.append((time.perf_counter() - began) * 1000)
        return reset_ms, latencies

    with ThreadPoolExecutor(len(envs)) as threads:
        played = list(threads.map(episode, envs, *zip(*entries, strict=True)))
    return [reset for reset, _ in played], [step for _, steps in played for step in steps]


def task_entry(tasks: dict[str, Any], data_idx: int) -> tuple[str, int]:
    task = next(
        t for t in tasks["tasks"] if t["first_idx"] <= data_idx < t["first_idx"] + t["count"]
    )
    return task["name"], data_idx - task["first_idx"]


def summarize_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """p50 per call over the rounds given, and the p50 batch wall time."""
    summary = {f"{name}_p50_ms": p50([v for r in rounds for v in r[name]]) for name in CALLS}
    return summary | {"batch_wall_p50_ms": p50([r["wall_ms"] for r in rounds])}


CALLS = ("create", "reset", "step")


def bench_batch_pattern(sessions: int, rounds: int, memory_rounds: int) -> dict[str, Any]:
    from scienceworld import ScienceWorldEnv

    os.environ["JAVA_TOOL_OPTIONS"] = SERVER_JVM_OPTIONS  # the in-process envs: the server's flags
    batch = ("--env", "sciworld", "--max-sessions", str(sessions), "--log-level", "warning")
    setups = {
        "a_reuse": ((*batch, "--warm", "2"), None),
        "b_reuse_off": ((*batch, "--warm", "2", *NO_REUSE), None),
        "c_agentgym_model": ((*batch, "--warm", "0", *NO_REUSE), ""),
    }
    played: dict[str, list[dict[str, Any]]] = {name: [] for name in setups}
    memory: dict[str, list[float]] = {name: [] for name in setups}
    settled: dict[str, list[float]] = {name: [] for name in setups}
    local_resets: list[float] = []
    local_steps: list[float] = []

    def indices(round_number: int) -> list[int]:
        offset = round_number * sessions
        return [
            RESET_INDICES[(offset + k) % len(RESET_INDICES)] + round_number for k in range(sessions)
        ]

    with (
        envserver(*setups["a_reuse"][0]) as (url_a, pid_a),
        envserver(*setups["b_reuse_off"][0]) as (url_b, pid_b),
        envserver(*setups["c_agentgym_model"][0], jvm_options="") as (url_c, pid_c),
    ):
        servers = {
            "a_reuse": (url_a, pid_a),
            "b_reuse_off": (url_b, pid_b),
            "c_agentgym_model": (url_c, pid_c),
        }
        pids = [pid_a, pid_b, pid_c]
        tasks = httpx.get(f"{url_a}/tasks").json()
        local_envs = [ScienceWorldEnv() for _ in range(sessions)]
        for env in local_envs:
            warm_up_like_the_server(env)

        async def play_rounds() -> None:
            limits = httpx.Limits(max_connections=sessions)
            clients = {
                name: httpx.AsyncClient(base_url=url, timeout=600, limits=limits)
                for name, (url, _) in servers.items()
            }
            for number in range(memory_rounds):
                # Side by side for the first rounds; then (a) alone, for its memory.
                names = list(setups) if number < rounds else ["a_reuse"]
                for name in names:
                    settle(pids)
                    played[name].append(await batch_round(clients[name], indices(number)))
                    memory[name].append(tree_rss_mib(servers[name][1]))
                    # Between batches: once the server has done what the batch left (warm-ups).
                    settle(pids)
                    settled[name].append(tree_rss_mib(servers[name][1]))
                if number < rounds:
                    entries = [task_entry(tasks, data_idx) for data_idx in indices(number)]
                    resets, steps = in_process_round(local_envs, entries)
                    local_resets.extend(resets)
                    local_steps.extend(steps)
            for client in clients.values():
                await client.aclose()

        asyncio.run(play_rounds())
        statuses = {name: httpx.get(f"{url}/status").json() for name, (url, _) in servers.items()}
        for env in local_envs:
            env.close()
    later = {name: summarize_rounds(runs[1:rounds]) for name, runs in played.items()}
    local_p50 = p50(local_steps[len(local_steps) // rounds :])  # rounds after the first
    local_reset_p50 = p50(local_resets[len(local_resets) // rounds :])
    reuse, agentgym = later["a_reuse"], later["c_agentgym_model"]
    return {
        "sessions_per_round": sessions,
        "rounds_side_by_side": rounds,
        "steps_per_episode": len(BATCH_STEPS),
        "first_round": {name: summarize_rounds(runs[:1]) for name, runs in played.items()},
        "later_rounds": later,
        "in_process_step_p50_ms": local_p50,
        # A full look-around step where the server's reset skips the valid-action queries.
        "in_process_reset_p50_ms": local_reset_p50,
        "step_ratio_vs_in_process": round(reuse["step_p50_ms"] / local_p50, 2),
        "batch_wall_speedup_vs_agentgym_model": round(
            agentgym["batch_wall_p50_ms"] / reuse["batch_wall_p50_ms"], 1
        ),
        "batch_wall_speedup_vs_reuse_off": round(
            later["b_reuse_off"]["batch_wall_p50_ms"] / reuse["batch_wall_p50_ms"], 1
        ),
        "server_rss_mib": {
            name: {
                "after_round_1": values[0],
                "after_last_round": values[-1],
                "rounds": len(values),
            }
            for name, values in memory.items()
        },
        "a_reuse_rss_mib_by_round": {
            number: {
                "at_round_end": memory["a_reuse"][number - 1],
                "between_batches": settled["a_reuse"][number - 1],
            }
            for number in (1, 2, 5, 10, 25, 50)
            if number <= len(memory["a_reuse"])
        },
        "memory_growth_a_reuse": round(memory["a_reuse"][-1] / memory["a_reuse"][0], 2),
        "memory_growth_a_reuse_between_batches": round(
            settled["a_reuse"][-1] / settled["a_reuse"][0], 2
        ),
        "envs": {
            name: {key: status[key] for key in ("envs_started", "envs_reused", "envs_retired")}
            for name, status in statuses.items()
        },
        "targets": {
            "create_p50_ms": 5,
            "reset_p50_ms": 100,
            "step_ratio_vs_in_process": 1.2,
            "batch_wall_speedup_vs_agentgym_model": 10,
            "memory_growth_after_50_rounds": 1.3,
        },
    }


SECTIONS = ("create_reset", "sciworld_step", "frozen_lake", "batch_pattern")


def load_average() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    parser.add_argument("--jvm-flags", action="store_true", help="also compare JVM flag sets")
    parser.add_argument(
        "--only", nargs="+", choices=(*SECTIONS, "jvm_flags"), help="run only these sections"
    )
    parser.add_argument(
        "--batch-sessions",
        type=int,
        default=8,
        help="concurrent episodes per batch_pattern round (the servers' --max-sessions)",
    )
    parser.add_argument("--probe-jvm", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe_jvm:
        print(json.dumps(probe_jvm()))
        return
    report: dict[str, Any] = {
        "box": {
            "cpus": os.cpu_count(),
            "load_average_at_start": load_average(),
            "note": "shared box: other builds and tests may run at the same time",
        }
    }
    wanted = set(args.only or SECTIONS) | ({"jvm_flags"} if args.jvm_flags else set())
    sections: dict[str, Callable[[], Any]] = {
        "create_reset": lambda: bench_create_reset(4 if args.quick else 10),
        "sciworld_step": lambda: bench_sciworld_step(*((12, 1) if args.quick else (90, 3))),
        "frozen_lake": lambda: bench_frozen_lake(64, 3.0 if args.quick else 10.0),
        "batch_pattern": lambda: bench_batch_pattern(
            args.batch_sessions, *((2, 3) if args.quick else (4, 50))
        ),
        "jvm_flags": lambda: bench_jvm_flags(1 if args.quick else 3),
    }
    for name, measure in sections.items():
        if name in wanted:
            run_section(report, name, measure)
    report["box"]["load_average_at_end"] = load_average()
    finish(report)


if __name__ == "__main__":
    main()
