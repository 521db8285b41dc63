"""Helpers for router tests: real env-server and router processes on free loopback ports."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO

import httpx
import pytest
from gymkube_dev.ports import free_port

# A Python server's start (its imports) on a loaded 2-core machine: `make test` runs pytest's two
# workers beside the e2e cluster's readying, and an OpenEnv server once took over a minute.
STARTUP_TIMEOUT = 180.0
# Fast polling so the tests see pool changes quickly; production defaults are slower.
FAST_POLLING = ["--poll-interval", "0.2", "--dead-after-seconds", "1"]


@dataclass
class Proc:
    name: str
    args: list[str]
    port: int = field(default_factory=free_port)
    # What follows the interpreter: a module to run with -m, or a script path.
    launcher: list[str] = field(default_factory=lambda: ["-m"])
    popen: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None
    # A router is ready for a test once it has polled every backend it was given as ready:
    # its /readyz answers as soon as one is, and sessions opened then all land on that one.
    backends: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Proc:
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            [sys.executable, *self.launcher, *self.args, *self._listen_flags()],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        return self

    def _listen_flags(self) -> list[str]:
        return ["--host", "127.0.0.1", "--port", str(self.port)]

    def output(self) -> str:
        if self.log is None:
            return ""
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-4000:]

    def wait_ready(self, path: str = "/readyz") -> None:
        assert self.popen is not None
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                pytest.fail(f"{self.name} exited with {self.popen.returncode}:\n{self.output()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + path, timeout=1.0).status_code == 200 and (
                    self.backends_ready() >= self.backends
                ):
                    return
            time.sleep(0.05)
        pytest.fail(f"{self.name} not ready after {STARTUP_TIMEOUT}s:\n{self.output()}")

    def backends_ready(self) -> int:
        """How many backends a router takes sessions on (0 for an env server)."""
        if not self.backends:
            return 0
        ready: int = httpx.get(self.url + "/status", timeout=1.0).json()["backends_ready"]
        return ready

    def signal(self, signum: signal.Signals) -> None:
        assert self.popen is not None
        os.kill(self.popen.pid, signum)

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(timeout=10)
        if self.log is not None:
            self.log.close()
            self.log = None


class Procs:
    """Starts processes and stops every one of them at teardown."""

    def __init__(self) -> None:
        self._started: list[Proc] = []

    def env_server(
        self, max_sessions: int, warm: int = 1, env: str = "frozen_lake", port: int | None = None
    ) -> Proc:
        proc = Proc(
            f"{env} env server (max {max_sessions})",
            [
                "gymkube_envserver.server",
                "--env",
                env,
                "--max-sessions",
                str(max_sessions),
                "--warm",
                str(warm),
                "--canary-interval",
                "0",
                "--log-level",
                "warning",
            ],
        )
        if port is not None:
            proc.port = port
        return self.start(proc)

    def router(self, *args: str, port: int | None = None, fast_polling: bool = True) -> Proc:
        polling = FAST_POLLING if fast_polling else []
        proc = Proc("router", ["gymkube_envserver.router", *polling, *args])
        if port is not None:
            proc.port = port
        return self.start(proc)

    def router_for(
        self, backends: list[Proc], *args: str, port: int | None = None, fast_polling: bool = True
    ) -> Proc:
        addresses = ",".join(b.address for b in backends)
        proc = self.router("--backends", addresses, *args, port=port, fast_polling=fast_polling)
        proc.backends = len(backends)
        return proc

    def start(self, proc: Proc) -> Proc:
        self._started.append(proc.start())
        return proc

    def stop_all(self) -> None:
        for proc in self._started:
            proc.stop()


def started_procs() -> Iterator[Procs]:
    """Processes a test starts, each killed by PID when it ends."""
    started = Procs()
    try:
        yield started
    finally:
        started.stop_all()


procs = pytest.fixture(started_procs, name="procs")
module_procs = pytest.fixture(started_procs, scope="module", name="module_procs")


def wait_all(*procs: Proc) -> None:
    for proc in procs:
        proc.wait_ready()


def active_sessions(backend: Proc) -> int:
    active: int = httpx.get(backend.url + "/status", timeout=2.0).json()["active"]
    return active


def backend_id(session_id: str) -> str:
    """The env server's own id inside a router session id (``<backend token>.<id>``)."""
    return session_id.partition(".")[2]


def play_until_done(
    client: httpx.Client, session_id: str, max_steps: int = 40
) -> dict[str, object]:
    """Step a FrozenLake episode to its end with a fixed move cycle; returns the last step."""
    moves = ["right", "down", "left", "down", "right", "up"]
    for turn in range(max_steps):
        response = client.post(
            "/step", json={"id": session_id, "action": f"<action>{moves[turn % 6]}</action>"}
        )
        assert response.status_code == 200, response.text
        body: dict[str, object] = response.json()
        if body["done"]:
            return body
    pytest.fail(f"episode of {session_id} not done after {max_steps} steps")
