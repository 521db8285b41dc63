"""``--admin-port``: /admin/* answers only there, so a NetworkPolicy can keep it to the operator."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gymkube_dev.ports import free_port
from gymkube_envserver.wire import ErrorCode

pytestmark = pytest.mark.unit

CLI = str(Path(sys.executable).with_name("gymkube-envserver"))


@pytest.fixture
def server_ports() -> Iterator[tuple[str, str]]:
    port, admin_port = free_port(), free_port()
    flags = ["--port", str(port), "--admin-port", str(admin_port), "--canary-interval", "0"]
    server = subprocess.Popen(
        [CLI, "--env", "frozen_lake", "--host", "127.0.0.1", *flags, "--warm", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    sessions, admin = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
            try:
                if httpx.get(f"{admin}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not become ready on both ports"
            time.sleep(0.1)
        yield sessions, admin
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_drain_is_refused_on_the_session_port_and_served_on_the_admin_port(
    server_ports: tuple[str, str],
) -> None:
    sessions, admin = server_ports
    refused = httpx.post(f"{sessions}/admin/drain")
    assert refused.status_code == 404
    assert refused.json()["error"]["code"] == ErrorCode.NOT_FOUND
    assert "admin port" in refused.json()["error"]["message"]
    assert httpx.get(f"{sessions}/status").json()["draining"] is False

    assert httpx.post(f"{admin}/admin/drain").json()["draining"] is True
    # One server behind both ports: the session port sees the drain at once.
    assert httpx.get(f"{sessions}/status").json()["draining"] is True
    assert httpx.post(f"{sessions}/create").status_code == 503


def test_a_port_already_taken_is_a_one_line_refusal() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        flags = ["--port", str(free_port()), "--admin-port", str(port)]
        done = subprocess.run(
            [CLI, "--env", "frozen_lake", "--host", "127.0.0.1", *flags],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    assert done.stderr.startswith("gymkube-envserver: cannot listen on 127.0.0.1:")
    assert "Traceback" not in done.stderr
