"""Tunnelled WebSockets when env servers die, freeze or idle, and when a router restarts."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import pytest
from gymkube_envserver.openenv_wire import CloseCode
from openenv.core.generic_client import GenericEnvClient
from router_harness import Proc, Procs, active_sessions, wait_all
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

pytestmark = pytest.mark.unit

MOVES = ["right", "down", "left", "down", "right", "up"]
SOCKETS = 16
LOST_WITHIN_S = 2.0


async def _call(ws: ClientConnection, frame: dict[str, object]) -> dict[str, object]:
    await ws.send(json.dumps(frame))
    reply: dict[str, object] = json.loads(await ws.recv())
    return reply


async def _open_sessions(router: Proc, count: int) -> list[tuple[ClientConnection, str]]:
    """``count`` sockets through the router, each reset, with the backend session id of each."""
    sockets = []
    for seed in range(count):
        ws = await connect(router.url.replace("http", "ws") + "/ws")
        await _call(ws, {"type": "reset", "data": {"seed": seed}})
        state = await _call(ws, {"type": "state"})
        sockets.append((ws, str(state["data"]["session_id"])))  # type: ignore[index]
    return sockets


def _holder(backends: list[Proc], session_id: str) -> Proc:
    for backend in backends:
        if httpx.get(f"{backend.url}/detail", params={"id": session_id}).status_code == 200:
            return backend
    pytest.fail(f"no backend holds session {session_id}")


async def _play_to_end(ws: ClientConnection) -> None:
    for turn in range(40):
        reply = await _call(
            ws, {"type": "step", "data": {"message": f"<action>{MOVES[turn % 6]}</action>"}}
        )
        assert reply["type"] == "observation", reply
        if reply["data"]["done"]:  # type: ignore[index]
            return
    pytest.fail("episode did not end")


async def _closed_with(ws: ClientConnection) -> tuple[int | None, float]:
    """The close code the client gets, and when (time.monotonic())."""
    try:
        while True:
            await ws.recv()
    except ConnectionClosed as closed:
        return (closed.rcvd.code if closed.rcvd else None), time.monotonic()


@pytest.mark.parametrize("failure", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
async def test_backend_loss_closes_exactly_its_websockets(
    procs: Procs, failure: signal.Signals
) -> None:
    backends = [procs.env_server(max_sessions=SOCKETS // 2 + 2) for _ in range(2)]
    router = procs.router_for(backends)
    wait_all(*backends, router)
    sockets = await _open_sessions(router, SOCKETS)
    doomed_backend = backends[0]
    doomed = [ws for ws, sid in sockets if _holder(backends, sid) is doomed_backend]
    survivors = [ws for ws, _ in sockets if ws not in doomed]
    assert doomed, "placement should spread sessions over both servers"
    assert survivors, "placement should spread sessions over both servers"

    watchers = [asyncio.create_task(_closed_with(ws)) for ws in doomed]
    # A step in flight on a doomed socket when its server goes away.
    await doomed[0].send(json.dumps({"type": "step", "data": {"message": "<action>up</action>"}}))
    await asyncio.sleep(0.05)
    failed_at = time.monotonic()
    doomed_backend.signal(failure)
    try:
        await asyncio.gather(*(_play_to_end(ws) for ws in survivors))
        closes = await asyncio.wait_for(asyncio.gather(*watchers), LOST_WITHIN_S + 1)
    finally:
        if failure == signal.SIGSTOP:
            doomed_backend.signal(signal.SIGCONT)
    for code, at in closes:
        assert code == CloseCode.SESSION_LOST
        assert at - failed_at < LOST_WITHIN_S
    for ws in survivors:
        await ws.close()
    for ws in doomed:
        await ws.close()


async def test_idle_websocket_is_reaped(procs: Procs) -> None:
    backend = procs.start(
        Proc(
            "frozen_lake env server (idle 1 s)",
            [
                "gymkube_envserver.server",
                "--env",
                "frozen_lake",
                "--max-sessions",
                "2",
                "--warm",
                "1",
                "--idle-timeout",
                "1",
                "--canary-interval",
                "0",
            ],
        )
    )
    router = procs.router_for([backend])
    wait_all(backend, router)
    [(ws, _)] = await _open_sessions(router, 1)
    assert active_sessions(backend) == 1
    code, _ = await asyncio.wait_for(_closed_with(ws), 5)
    assert code == CloseCode.SESSION_EXPIRED
    assert active_sessions(backend) == 0


def test_router_restart_ends_websockets_with_going_away(procs: Procs) -> None:
    """Open WebSockets through a restarted router end with 1001 and free their sessions;
    HTTP sessions carry on through the other replica, and new sockets connect there."""
    backend = procs.env_server(max_sessions=4)
    first, second = procs.router_for([backend]), procs.router_for([backend])
    wait_all(backend, first, second)
    http_session = httpx.post(first.url + "/create").json()["id"]
    httpx.post(first.url + "/reset", json={"id": http_session, "data_idx": 0}).raise_for_status()

    async def through_first_router() -> int | None:
        [(ws, _)] = await _open_sessions(first, 1)
        first.signal(signal.SIGTERM)
        code, _ = await asyncio.wait_for(_closed_with(ws), 5)
        return code

    assert asyncio.run(through_first_router()) == CloseCode.GOING_AWAY
    deadline = time.monotonic() + 3
    while active_sessions(backend) != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert active_sessions(backend) == 1  # only the HTTP session is left
    step = httpx.post(
        second.url + "/step", json={"id": http_session, "action": "<action>up</action>"}
    )
    assert step.status_code == 200, step.text
    with GenericEnvClient(base_url=second.url).sync() as env:
        assert env.reset(seed=2).done is False
