"""Env-server benchmarks, measured side by side in one run; prints JSON.

    .venv/bin/python bench/envserver.py [--quick] [--jvm-flags]

- create_reset: ScienceWorld /create + /reset p50 from a warm pool versus cold (``--warm 0``: a new
  JVM per /create, as AgentGym's server does), cold also with JVM default flags (AgentGym's setup).
  Target: warm at least 20x faster than cold.
- sciworld_step: one ScienceWorld step over HTTP versus ``env.step`` in-process, the two
  interleaved on identical action sequences. Target: at most 1.2x (at most 5 ms added at p50).
- frozen_lake: steps/s with 64 concurrent sessions on one server process (client in another
  process, keep-alive connections). Target: at least 2,000 steps/s.
- reset_parts: where a /reset on a warmed JVM spends its time, part by part (wall and JVM CPU),
  and what loading the same task variation again costs.
- batch_pattern (``batch_pattern.py``): what a GRPO rollout does for days: rounds of
  ``--batch-sessions`` concurrent ScienceWorld episodes against gymkube with and without env reuse
  and AgentGym's model (a new JVM per /create), side by side, then memory over 50 rounds.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from batch_pattern import bench_batch_pattern
from envserver_procs import (
    NO_REUSE,
    RESET_INDICES,
    SERVER_JVM_OPTIONS,
    STEP_ACTIONS,
    cpu_seconds,
    envserver,
    load_average,
    p50,
    settle,
    wait_warm,
    warm_up_like_the_server,
)
from gymkube_envserver.envs.sciworld import jvm_tool_options
from gymkube_envserver.settings import DEFAULT_JVM_OPTIONS
from sections import finish, run_section

FROZEN_MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
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


def bench_reset_parts(resets: int) -> dict[str, Any]:
    """Where a reset on a warmed JVM goes: wall and JVM CPU ms of each part the server's reset
    does (the wrapper's checks, ScienceWorld's task load, the task description, the first look
    around), the same variation loaded again, and a full step's JVM CPU; p50 wall, mean CPU."""
    os.environ["JAVA_TOOL_OPTIONS"] = SERVER_JVM_OPTIONS
    from gymkube_envserver.envs.sciworld import look_around
    from scienceworld import ScienceWorldEnv

    env = ScienceWorldEnv()
    warm_up_like_the_server(env)
    time.sleep(2.0)  # JIT compiles the warm-up queued
    jvm = env._gateway.java_process.pid
    parts: dict[str, Callable[[str, int], Any]] = {
        "wrapper_checks": lambda task, variation: (
            env.get_task_names(),
            env.get_possible_simplifications(),
        ),
        "task_load": lambda task, variation: env.server.load(task, variation, "", False),
        "task_description": lambda task, variation: env.get_task_description(),
        "first_look_around": lambda task, variation: look_around(env),
        "same_task_loaded_again": lambda task, variation: env.server.load(
            task, variation, "", False
        ),
        "full_step": lambda task, variation: env.step("inventory"),
    }
    wall: dict[str, list[float]] = {name: [] for name in parts}
    cpu: dict[str, list[float]] = {name: [] for name in parts}
    names = env.get_task_names()
    for number in range(resets):
        task = names[number * 7 % len(names)]
        variation = number % int(env.get_max_variations(task))
        env.taskName, env.variationIdx, env.simplificationStr = task, variation, ""
        for name, part in parts.items():
            cpu_before, began = cpu_seconds(jvm), time.perf_counter()
            part(task, variation)
            wall[name].append((time.perf_counter() - began) * 1000)
            cpu[name].append((cpu_seconds(jvm) - cpu_before) * 1000)
    env.close()
    reset_parts = ("wrapper_checks", "task_load", "task_description", "first_look_around")
    return {
        "resets": resets,
        "wall_p50_ms": {name: p50(values) for name, values in wall.items()},
        "jvm_cpu_mean_ms": {name: round(statistics.mean(v), 1) for name, v in cpu.items()},
        "reset_wall_p50_ms": p50(
            [sum(wall[name][k] for name in reset_parts) for k in range(resets)]
        ),
        "load_average": load_average(),
    }


SECTIONS = ("create_reset", "sciworld_step", "frozen_lake", "reset_parts", "batch_pattern")


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
    parser.add_argument(
        "--batch-rounds",
        type=int,
        default=6,
        help="batch_pattern rounds played side by side (the first is cold for all three)",
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
        "reset_parts": lambda: bench_reset_parts(10 if args.quick else 40),
        "batch_pattern": lambda: bench_batch_pattern(
            args.batch_sessions, *((2, 3) if args.quick else (args.batch_rounds, 50))
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
