"""Slow is not dead: what the router's dead window costs when a node is busy, and what it buys.

    .venv/bin/python bench/router_starved.py [--seconds 40] [--burners 4] [--windows 2,10]

For each `--dead-after-seconds` in --windows, side by side: an env server and a router at the
lowest CPU priority (nice 19, the share a pod requesting 20m gets beside a trainer requesting
cores), CPU burners at normal priority, and 16 sessions playing FrozenLake episodes with half a
second between steps, as an agent does. Per window: the episodes played and the sessions the
router declared lost (410 on a reset or a step) and the creates it refused (503: no server
taking sessions) though the server was only slow; then, with the machine quiet, how
long a step in flight on a frozen server (SIGSTOP) takes to get its 410. A window of 2 s is
about the rule gymkube's router had before (two failed polls of 1 s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests" / "unit" / "router"))

from router_harness import Proc, started_procs, wait_all  # noqa: E402

SESSIONS = 16
THINK_S = 0.5
LAKE = {"size": 2, "moves": "word"}


def lowest_priority(*procs: Proc) -> None:
    for proc in procs:
        assert proc.popen is not None
        os.setpriority(os.PRIO_PROCESS, proc.popen.pid, 19)


async def play(url: str, index: int, until: float, counts: dict[str, int]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=120.0) as http:
        while time.monotonic() < until:
            created = await http.post("/create", json={"env_config": LAKE})
            if created.status_code != 200:
                counts["creates_refused"] += 1
                await asyncio.sleep(THINK_S)
                continue
            session_id = created.json()["id"]
            reset = await http.post("/reset", json={"id": session_id, "data_idx": index})
            lost = reset.status_code == 410
            counts["sessions_lost"] += lost
            for _ in range(0 if lost else 8):
                await asyncio.sleep(THINK_S)
                step = await http.post("/step", json={"id": session_id, "action": "Down."})
                if step.status_code == 410:
                    counts["sessions_lost"] += 1
                    lost = True
                    break
                counts["steps"] += 1
                if step.json().get("done"):
                    break
            if not lost:
                counts["episodes"] += 1
                await http.post("/close", json={"id": session_id})


def starved(window: float, seconds: float, burners: int) -> dict[str, Any]:
    with contextlib.contextmanager(started_procs)() as procs:
        server = procs.env_server(max_sessions=SESSIONS + 4, warm=2)
        router = procs.router_for([server], "--dead-after-seconds", str(window), fast_polling=False)
        wait_all(server, router)
        lowest_priority(server, router)
        burning = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(burners)
        ]
        counts = dict.fromkeys(("episodes", "steps", "sessions_lost", "creates_refused"), 0)
        try:
            until = time.monotonic() + seconds

            async def all_sessions() -> None:
                await asyncio.gather(*(play(router.url, i, until, counts) for i in range(SESSIONS)))

            asyncio.run(all_sessions())
        finally:
            for burner in burning:
                burner.kill()
                burner.wait()
    return counts


def frozen(window: float) -> float:
    """Seconds from SIGSTOP to the 410 of a step sent to the frozen server."""
    with contextlib.contextmanager(started_procs)() as procs:
        server = procs.env_server(max_sessions=1)
        router = procs.router_for([server], "--dead-after-seconds", str(window), fast_polling=False)
        wait_all(server, router)
        with httpx.Client(base_url=router.url, timeout=120.0) as http:
            session_id = http.post("/create", json={"env_config": LAKE}).json()["id"]
            http.post("/reset", json={"id": session_id, "data_idx": 0})
            server.signal(signal.SIGSTOP)
            stopped = time.monotonic()
            try:
                step = http.post("/step", json={"id": session_id, "action": "Down."})
            finally:
                server.signal(signal.SIGCONT)
            assert step.status_code == 410, step.text
            return round(time.monotonic() - stopped, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--burners", type=int, default=4)
    parser.add_argument("--windows", default="2,10")
    args = parser.parse_args()
    windows = [float(w) for w in args.windows.split(",")]
    results = {}
    for window in windows:
        result = {
            "dead_after_seconds": window,
            "busy_node": starved(window, args.seconds, args.burners),
            "frozen_server_410_after_s": frozen(window),
        }
        print(json.dumps(result), flush=True)
        results[window] = result
    base, new = results[windows[0]], results[windows[-1]]
    print(
        json.dumps(
            {
                "burners": args.burners,
                "seconds": args.seconds,
                "sessions_lost": [r["busy_node"]["sessions_lost"] for r in results.values()],
                "episodes_ratio": round(
                    new["busy_node"]["episodes"] / max(1, base["busy_node"]["episodes"]), 2
                ),
                "frozen_410_after_s": [r["frozen_server_410_after_s"] for r in results.values()],
            }
        )
    )


if __name__ == "__main__":
    main()
