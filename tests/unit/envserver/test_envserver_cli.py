"""The ``gymkube-envserver`` command: flags, GYMKUBE_* environment variables, clear refusals."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from gymkube_dev.ports import free_port

pytestmark = pytest.mark.unit

CLI = str(Path(sys.executable).with_name("gymkube-envserver"))


def test_flags_and_environment_configure_a_running_server() -> None:
    port = free_port()
    env = {**os.environ, "GYMKUBE_MAX_SESSIONS": "3", "GYMKUBE_WARM": "2"}
    server = subprocess.Popen(
        [
            CLI,
            "--env",
            "frozen_lake",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--idle-timeout",
            "60",
            "--canary-interval",
            "0",
            "--env-config",
            '{"size": 2}',
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
            try:
                if httpx.get(f"{base}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not become ready"
            time.sleep(0.1)
        status = httpx.get(f"{base}/status").json()
        assert (status["env"], status["capacity"], status["warm"]) == ("frozen_lake", 3, 2)
        assert status["env_config"] == {"size": 2}
        session = httpx.post(f"{base}/create").json()["id"]
        reset = httpx.post(f"{base}/reset", json={"id": session, "data_idx": 1})
        assert reset.status_code == 200
        assert reset.json()["task_description"].startswith("FrozenLake 2x2")
    finally:
        server.terminate()
        server.wait(timeout=30)
    # SIGTERM shuts down gracefully (uvicorn then re-raises the signal, hence the exit status).
    assert "Application shutdown complete" in (
        server.stderr.read().decode() if server.stderr else ""
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "chess"], "unknown env 'chess'"),
        (["--env", "frozen_lake", "--max-sessions", "0"], "max_sessions"),
        (["--env", "plugin:nowhere_at_all:Env"], "cannot import plugin module"),
        (
            ["--env", "frozen_lake", "--env-config", '{"size": 99}'],
            "--env-config: invalid frozen_lake env_config: size",
        ),
        (["--env", "frozen_lake", "--env-config", '{"size": 2'], "env_config"),
    ],
)
def test_bad_configuration_exits_with_a_clear_message(args: list[str], message: str) -> None:
    done = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr
