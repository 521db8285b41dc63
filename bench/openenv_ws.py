"""OpenEnv over WebSocket: OpenEnv's own server vs gymkube's env server, and the router's cost.

One run, same machine, same env (TextArena Sudoku-v0) and the same load, one server at a time:

- openenv_server: OpenEnv 0.10's own server (``openenv.core.env_server.create_app`` under uvicorn,
  as OpenEnv's Dockerfiles run it) around a thin TextArena ``Environment``
  (``examples/openenv-sudoku/sudoku_server.py``) that makes the same TextArena calls gymkube's env
  does (none of the message conversion of OpenEnv's own TextArena adapter, which costs it more
  CPU per step: this favours OpenEnv).
- gymkube_server: ``gymkube-envserver --env textarena:Sudoku-v0`` speaking OpenEnv on ``/ws``.
- gymkube_via_router: the same server through ``gymkube-router`` (a tunnelled WebSocket).

Each of ``--sessions`` (16 and 64) clients opens a socket and plays episodes: reset with a seed,
solve the board, send up to 20 valid moves, reset again, until the window ends. Reported per
server and load: steps/s, server CPU µs per step (utime+stime from /proc over the window),
p50/p99 step latency, RSS per open session, and for the router its added p50/p99 latency and
its CPU µs per relayed WebSocket message. Goal: gymkube >= OpenEnv's server on every figure.
The env alone (the same TextArena calls for the same episodes, in this process, no server) is
the floor under any server's CPU per step: ``targets`` sets it beside a third of OpenEnv's.

    .venv/bin/python bench/openenv_ws.py [--window 8] [--rounds 3] [--sessions 16 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

SCRIPT = str(Path(__file__).resolve())
REPO_ROOT = Path(SCRIPT).parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests" / "unit" / "router"))
sys.path.insert(0, str(REPO_ROOT / "tests" / "unit" / "openenv"))

from measure import cpu_seconds  # noqa: E402
from openenv_sudoku import GAME, openenv_sudoku_server  # noqa: E402
from router_harness import Proc, Procs  # noqa: E402
from sections import finish, run_async_section  # noqa: E402

MOVES_PER_EPISODE = 20
WARMUP_S = 1.0


# -- the client side ---------------------------------------------------------------------------

_ROW = re.compile(r"^R(\d)\s+(.*)$")


def parse_board(text: str) -> list[list[int]]:
    """The last board drawn in a Sudoku observation (0 for an empty cell)."""
    rows: dict[int, list[int]] = {}
    for line in text.splitlines():
        match = _ROW.match(line.strip())
        if match:
            cells = [c for c in match.group(2).replace("|", " ").split() if c]
            rows[int(match.group(1))] = [0 if c == "." else int(c) for c in cells]
    return [rows[r] for r in range(1, 10)]


def solve(board: list[list[int]]) -> list[list[int]] | None:
    grid = [row[:] for row in board]

    def fits(r: int, c: int, n: int) -> bool:
        if n in grid[r] or any(grid[i][c] == n for i in range(9)):
            return False
        br, bc = r - r % 3, c - c % 3
        return all(grid[i][j] != n for i in range(br, br + 3) for j in range(bc, bc + 3))

    def search() -> bool:
        for r in range(9):
            for c in range(9):
                if grid[r][c] == 0:
                    for n in range(1, 10):
                        if fits(r, c, n):
                            grid[r][c] = n
                            if search():
                                return True
                            grid[r][c] = 0
                    return False
        return True

    return grid if search() else None


def valid_moves(observation: str) -> list[str]:
    board = parse_board(observation)
    solved = solve(board)
    if solved is None:
        return []
    return [
        f"[{r + 1} {c + 1} {solved[r][c]}]" for r in range(9) for c in range(9) if board[r][c] == 0
    ][:MOVES_PER_EPISODE]


async def player(url: str, seed: int, stop_at: float, latencies: list[float]) -> None:
    """Play episodes on one socket until ``stop_at``, appending each step's latency."""
    from websockets.asyncio.client import connect

    async with connect(url, max_size=None, compression=None) as ws:
        episode = seed
        while time.monotonic() < stop_at:
            await ws.send(json.dumps({"type": "reset", "data": {"seed": episode}}))
            reply = json.loads(await ws.recv())
            episode += 1000
            if reply["type"] != "observation":
                raise RuntimeError(f"reset refused: {reply}")
            for move in valid_moves(reply["data"]["observation"]["prompt"]):
                sent = time.monotonic()
                if sent >= stop_at:
                    break
                await ws.send(json.dumps({"type": "step", "data": {"message": move}}))
                answer = json.loads(await ws.recv())
                if answer["type"] != "observation":
                    raise RuntimeError(f"step refused: {answer}")
                latencies.append(time.monotonic() - sent)
                if answer["data"]["done"]:
                    break


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def rss_per_session(url: str, pid: int, sessions: int) -> float:
    """KiB of server RSS per open, reset session."""
    from websockets.asyncio.client import connect

    before = rss_kib(pid)
    sockets = [await connect(url, max_size=None, compression=None) for _ in range(sessions)]
    try:
        for seed, ws in enumerate(sockets):
            await ws.send(json.dumps({"type": "reset", "data": {"seed": seed}}))
            await ws.recv()
        await asyncio.sleep(0.5)
        return (rss_kib(pid) - before) / sessions
    finally:
        for ws in sockets:
            await ws.close()


async def measure(url: str, pids: dict[str, int], sessions: int, window: float) -> dict[str, Any]:
    """Steps/s, latency and CPU per step of ``sessions`` players for ``window`` seconds."""
    latencies: list[float] = []
    start = time.monotonic()
    stop_at = start + WARMUP_S + window
    players = [
        asyncio.create_task(player(url, seed, stop_at, latencies)) for seed in range(sessions)
    ]
    await asyncio.sleep(WARMUP_S)
    latencies.clear()
    cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    measured_from = time.monotonic()
    await asyncio.gather(*players)
    elapsed = time.monotonic() - measured_from
    steps = len(latencies)
    cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
    ordered = sorted(latencies)
    result: dict[str, Any] = {
        "steps": steps,
        "steps_per_s": round(steps / elapsed, 1),
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p99_ms": round(ordered[int(0.99 * (steps - 1))] * 1000, 2),
    }
    for name, seconds in cpu.items():
        result[f"{name}_cpu_us_per_step"] = round(seconds / steps * 1e6, 1)
    return result


def env_alone_cpu_us_per_step(episodes: int) -> float:
    """CPU µs per step of the env itself, resets included as in the servers' figures: the
    TextArena calls both servers make (reset, step, observation) for the players' episodes, the
    moves worked out beforehand; one env object reset each time, the cheapest way to play."""
    import textarena

    game = textarena.make(GAME)
    cpu, steps = 0.0, 0
    for seed in range(episodes):
        started = time.process_time()
        game.reset(num_players=1, seed=seed * 1000)
        observation = str(game.get_observation()[1])
        cpu += time.process_time() - started
        for move in valid_moves(observation):
            started = time.process_time()
            done, _ = game.step(move)
            str(game.get_observation()[1])
            cpu += time.process_time() - started
            steps += 1
            if done:
                break
    return round(cpu / steps * 1e6, 1)


# -- the run -----------------------------------------------------------------------------------


def ws_url(proc: Proc) -> str:
    return f"ws://127.0.0.1:{proc.port}/ws"


ROUTES = ("openenv_server", "gymkube_server", "gymkube_via_router")


async def bench_load(procs: Procs, sessions: int, window: float, rounds: int) -> dict[str, Any]:
    capacity = str(sessions + 4)
    # One at a time: on a busy machine three servers importing at once outlast the harness's wait.
    openenv = procs.start(openenv_sudoku_server(int(capacity)))
    openenv.wait_ready("/health")
    gymkube = procs.start(
        Proc(
            "gymkube env server",
            [
                "gymkube_envserver.server",
                "--env",
                f"textarena:{GAME}",
                "--max-sessions",
                capacity,
                "--warm",
                "4",
                "--canary-interval",
                "0",
                "--log-level",
                "warning",
            ],
        )
    )
    gymkube.wait_ready()
    router = procs.router_for([gymkube], fast_polling=False)
    router.wait_ready()
    assert openenv.popen
    assert gymkube.popen
    assert router.popen
    report: dict[str, Any] = {"sessions": sessions}
    # On fresh processes, before any load has grown their heaps.
    report["rss_kib_per_session"] = {
        "openenv_server": await rss_per_session(ws_url(openenv), openenv.popen.pid, sessions),
        "gymkube_server": await rss_per_session(ws_url(gymkube), gymkube.popen.pid, sessions),
    }
    # Rounds alternate the three routes, so drift on a shared machine hits each alike.
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in ROUTES}
    for _ in range(rounds):
        runs["openenv_server"].append(
            await measure(ws_url(openenv), {"server": openenv.popen.pid}, sessions, window)
        )
        runs["gymkube_server"].append(
            await measure(ws_url(gymkube), {"server": gymkube.popen.pid}, sessions, window)
        )
        runs["gymkube_via_router"].append(
            await measure(
                ws_url(router),
                {"server": gymkube.popen.pid, "router": router.popen.pid},
                sessions,
                window,
            )
        )
    for name, results in runs.items():
        report[name] = {key: statistics.median(r[key] for r in results) for key in results[0]}
    routed = report["gymkube_via_router"]
    direct = report["gymkube_server"]
    routed["router_added_p50_ms"] = round(routed["p50_ms"] - direct["p50_ms"], 2)
    routed["router_added_p99_ms"] = round(routed["p99_ms"] - direct["p99_ms"], 2)
    # Two relayed frames per step: the step and its observation.
    routed["router_cpu_us_per_message"] = round(routed["router_cpu_us_per_step"] / 2, 1)
    ours, theirs = report["gymkube_server"], report["openenv_server"]
    rss = report["rss_kib_per_session"]
    floor = env_alone_cpu_us_per_step(episodes=40)
    report["env_alone_cpu_us_per_step"] = floor
    report["targets"] = {
        "cpu_at_most_a_third_of_openenv": ours["server_cpu_us_per_step"]
        <= theirs["server_cpu_us_per_step"] / 3,
        "steps_per_s_at_least_1_5x": ours["steps_per_s"] >= 1.5 * theirs["steps_per_s"],
        "p99_at_most_openenv": ours["p99_ms"] <= theirs["p99_ms"],
        # False: a third of OpenEnv's CPU per step is less than the env's own calls cost.
        "env_alone_within_a_third_of_openenv": floor <= theirs["server_cpu_us_per_step"] / 3,
    }
    report["gymkube_at_least_openenv"] = {
        "steps_per_s": ours["steps_per_s"] >= theirs["steps_per_s"],
        "cpu_us_per_step": ours["server_cpu_us_per_step"] <= theirs["server_cpu_us_per_step"],
        "p50_ms": ours["p50_ms"] <= theirs["p50_ms"],
        "p99_ms": ours["p99_ms"] <= theirs["p99_ms"],
        "rss_per_session": rss["gymkube_server"] <= rss["openenv_server"],
    }
    for proc in (router, gymkube, openenv):
        proc.stop()
    return report


async def main(args: argparse.Namespace) -> None:
    report: dict[str, Any] = {
        "env": f"textarena:{GAME}",
        "window_s": args.window,
        "rounds": args.rounds,
        "figures": "medians over rounds",
    }
    procs = Procs()
    try:
        for sessions in args.sessions:
            await run_async_section(
                report,
                f"sessions_{sessions}",
                lambda sessions=sessions: bench_load(procs, sessions, args.window, args.rounds),
            )
    finally:
        procs.stop_all()
    finish(report)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=8.0)
    parser.add_argument("--sessions", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
