"""A pool with no Ready env server (an autoscaled pool at zero): the router holds new sessions,
over HTTP and OpenEnv's WebSocket, until a server comes up, and says why when none does."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from gymkube_dev.ports import free_port
from openenv.core.generic_client import GenericEnvClient
from router_harness import Procs, play_until_done

pytestmark = pytest.mark.unit


def waiting(router_url: str) -> int:
    count: int = httpx.get(router_url + "/status", timeout=2.0).json()["waiting"]
    return count


def openenv_reset(router_url: str) -> dict[str, Any]:
    with GenericEnvClient(base_url=router_url).sync() as env:
        first = env.reset(seed=3)
        return dict(first.observation)


def test_sessions_wait_for_the_first_server_of_a_pool_at_zero(procs: Procs) -> None:
    port = free_port()  # where the pool's server will listen once it is started
    router = procs.router("--backends", f"127.0.0.1:{port}", "--create-hold", "60")
    # Ready without a server: the pool's Service must keep the router while the pool is at zero.
    router.wait_ready()
    readyz = httpx.get(router.url + "/readyz").json()
    assert readyz["ready"] is False
    assert "held up to 60 s" in readyz["reason"]

    with ThreadPoolExecutor(2) as clients:
        created = clients.submit(httpx.post, router.url + "/create", json={}, timeout=90)
        socket = clients.submit(openenv_reset, router.url)
        deadline = time.monotonic() + 30
        while waiting(router.url) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert waiting(router.url) == 2, "the router should hold both new sessions"
        assert not created.done()
        assert not socket.done()

        procs.env_server(max_sessions=4, port=port)
        reply = created.result(timeout=90)
        assert reply.status_code == 200, reply.text
        assert "FrozenLake" in socket.result(timeout=90)["task_description"]
    assert waiting(router.url) == 0
    with httpx.Client(base_url=router.url, timeout=30.0) as http:
        session_id = reply.json()["id"]
        assert http.post("/reset", json={"id": session_id, "data_idx": 0}).status_code == 200
        assert play_until_done(http, session_id)["done"]


def test_a_hold_that_ends_without_a_server_says_why(procs: Procs) -> None:
    router = procs.router(
        "--backends", f"127.0.0.1:{free_port()}", "--create-wait", "0", "--create-hold", "1",
        "--retry-after", "3",
    )  # fmt: skip
    router.wait_ready()
    started = time.monotonic()
    refused = httpx.post(router.url + "/create", json={}, timeout=30)
    assert 1 <= time.monotonic() - started < 10
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "3"
    error = refused.json()["error"]
    assert error["code"] == "at_capacity"
    assert "no env server became ready in 1 s" in error["message"]
