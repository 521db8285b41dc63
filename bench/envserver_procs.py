"""Real gymkube-envserver processes for the env-server benchmarks, and what their process trees
(a server and its JVMs) use: CPU seconds and resident memory."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
from gymkube_dev.ports import free_port
from gymkube_dev.processes import stop
from gymkube_envserver.envs.sciworld import jvm_tool_options
from gymkube_envserver.settings import DEFAULT_JVM_OPTIONS

CLI = str(Path(sys.executable).with_name("gymkube-envserver"))
NO_REUSE = ("--reuse", "false")
RESET_INDICES = [0, 500, 1200, 2100, 3000, 3800, 4400, 250, 1700, 2600, 3300, 4000]
STEP_ACTIONS = ["look around", "inventory", "look at agent", "wait1", "task", "look around"]
SERVER_JVM_OPTIONS = jvm_tool_options(DEFAULT_JVM_OPTIONS, None)
"""What a server's JVMs run with by default: --jvm-options plus the constant identity hash."""


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
        stop(server, timeout=60)


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
    """CPU seconds of a process tree, counting the children it has reaped (closed JVMs)."""
    total = 0.0
    for member in process_tree(pid):
        with suppress(OSError):
            total += cpu_seconds(member, reaped_children=True)
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


def cpu_seconds(pid: int, reaped_children: bool = False) -> float:
    """User + system CPU time of a process so far (and of its children it has waited for)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(value) for value in fields[11 : 15 if reaped_children else 13])
    return ticks / os.sysconf("SC_CLK_TCK")


def tree_rss_mib(pid: int) -> float:
    """Resident memory of a server and its JVMs together."""
    total_kb = 0
    for member in process_tree(pid):
        with suppress(OSError, IndexError):
            status = Path(f"/proc/{member}/status").read_text()
            total_kb += int(status.split("VmRSS:")[1].split()[0])
    return round(total_kb / 1024, 1)


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


def load_average() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]
