"""The batch-pattern section of ``bench/envserver.py``: what a GRPO rollout does for days.

Rounds of ``sessions`` concurrent ScienceWorld episodes (create, reset, 3 steps, close) against (a)
gymkube with env reuse, (b) gymkube with ``--reuse false``, (c) AgentGym's model (``--warm 0
--reuse false``, JVM default flags: a new JVM per /create), the three round by round on a settled
box, plus the same episodes' steps on warmed in-process envs at the same concurrency. (a) then
plays on to ``memory_rounds`` rounds for its memory. Targets for rounds after the first, with
reuse: create p50 <= 5 ms, reset p50 <= 100 ms, step p50 <= 1.2x in-process, batch wall time
>= 10x better than (c); server memory after 50 rounds <= 1.3x after round 1.

Besides what the client sees, each call's time inside the server (its request-duration histogram)
and the CPU seconds the server's JVMs spent per reset and step tell a slow box from a slow server.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp
import httpx
from envserver_procs import (
    NO_REUSE,
    RESET_INDICES,
    SERVER_JVM_OPTIONS,
    STEP_ACTIONS,
    envserver,
    load_average,
    p50,
    settle,
    tree_cpu_seconds,
    tree_rss_mib,
    warm_up_like_the_server,
)

BATCH_STEPS = STEP_ACTIONS[:3]
CALLS = ("create", "reset", "step")
MEMORY_AT_ROUNDS = (1, 2, 5, 10, 25, 50)


async def server_seconds(http: aiohttp.ClientSession) -> dict[str, tuple[float, float]]:
    """Per call: (seconds inside the server so far, calls so far), from its /metrics."""
    async with http.get("/metrics") as response:
        text = await response.text()
    totals = {}
    for call in CALLS:
        labels = f'{{endpoint="/{call}"}}'
        found = [
            re.search(rf"request_duration_seconds_{kind}{re.escape(labels)} (\S+)", text)
            for kind in ("sum", "count")
        ]
        seconds, count = (float(match.group(1)) if match else 0.0 for match in found)
        totals[call] = (seconds, count)
    return totals


async def batch_round(
    http: aiohttp.ClientSession, server_pid: int, data_indices: list[int]
) -> dict[str, Any]:
    """One rollout batch: an episode per data_idx, all at once; per-call latencies, wall time,
    the mean time inside the server per call, and the server tree's CPU seconds.

    ``http`` is an aiohttp session that lives across rounds, as the trainer's env client keeps
    (gymkube_agentloop.client: one aiohttp session, keep-alive connections)."""
    calls: dict[str, list[float]] = {name: [] for name in CALLS}

    async def timed(name: str, path: str, body: dict[str, Any]) -> Any:
        began = time.perf_counter()
        async with http.post(path, json=body) as response:
            response.raise_for_status()
            answer = await response.json()
        calls[name].append((time.perf_counter() - began) * 1000)
        return answer

    async def episode(data_idx: int) -> None:
        session = (await timed("create", "/create", {}))["id"]
        await timed("reset", "/reset", {"id": session, "data_idx": data_idx})
        for action in BATCH_STEPS:
            await timed("step", "/step", {"id": session, "action": action})
        async with http.post("/close", json={"id": session}) as response:
            response.raise_for_status()

    inside_before = await server_seconds(http)
    cpu_before = tree_cpu_seconds(server_pid)
    began = time.perf_counter()
    await asyncio.gather(*(episode(data_idx) for data_idx in data_indices))
    wall_ms = (time.perf_counter() - began) * 1000
    cpu_s = tree_cpu_seconds(server_pid) - cpu_before
    inside_after = await server_seconds(http)
    inside = {call: (inside_after[call][0] - inside_before[call][0]) * 1000 for call in CALLS}
    return {
        "wall_ms": wall_ms,
        **calls,
        "inside_ms": inside,
        "server_cpu_s": cpu_s,
        "load": os.getloadavg()[0],
    }


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
    """p50 per call over the rounds given, the p50 batch wall time, the mean time inside the
    server per call, the server's CPU per episode and the load average range."""
    summary: dict[str, Any] = {
        f"{name}_p50_ms": p50([v for r in rounds for v in r[name]]) for name in CALLS
    }
    calls = {name: sum(len(r[name]) for r in rounds) for name in CALLS}
    episodes = calls["create"]
    return summary | {
        "batch_wall_p50_ms": p50([r["wall_ms"] for r in rounds]),
        "inside_server_mean_ms": {
            name: round(sum(r["inside_ms"][name] for r in rounds) / calls[name], 2)
            for name in CALLS
        },
        "server_cpu_ms_per_episode": round(
            sum(r["server_cpu_s"] for r in rounds) / episodes * 1000, 1
        ),
        "load_average_1m": [
            round(min(r["load"] for r in rounds), 1),
            round(max(r["load"] for r in rounds), 1),
        ],
    }


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
            clients = {
                name: aiohttp.ClientSession(
                    url,
                    # Idle connections closed before the server's own keep-alive (uvicorn: 5 s)
                    # drops them, as the router does: the settling between rounds is longer.
                    connector=aiohttp.TCPConnector(limit=sessions, keepalive_timeout=3.0),
                    timeout=aiohttp.ClientTimeout(total=600),
                )
                for name, (url, _) in servers.items()
            }
            for number in range(memory_rounds):
                # Side by side for the first rounds; then (a) alone, for its memory.
                names = list(setups) if number < rounds else ["a_reuse"]
                for name in names:
                    settle(pids)
                    pid = servers[name][1]
                    played[name].append(await batch_round(clients[name], pid, indices(number)))
                    memory[name].append(tree_rss_mib(pid))
                    # Between batches: once the server has done what the batch left (warm-ups).
                    settle(pids)
                    settled[name].append(tree_rss_mib(pid))
                if number < rounds:
                    entries = [task_entry(tasks, data_idx) for data_idx in indices(number)]
                    resets, steps = in_process_round(local_envs, entries)
                    local_resets.extend(resets)
                    local_steps.extend(steps)
            for client in clients.values():
                await client.close()

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
        "cpus": os.cpu_count(),
        "load_average_at_end": load_average(),
        "first_round": {name: summarize_rounds(runs[:1]) for name, runs in played.items()},
        "later_rounds": later,
        "a_reuse_after_side_by_side": summarize_rounds(played["a_reuse"][rounds:])
        if len(played["a_reuse"]) > rounds
        else None,
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
            for number in MEMORY_AT_ROUNDS
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
