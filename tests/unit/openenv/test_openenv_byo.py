"""Bring your own OpenEnv server: the router in front of real OpenEnv servers (no /status)."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import aiohttp
import pytest
from gymkube_envserver.openenv_wire import CloseCode
from gymkube_envserver.router.settings import RouterSettings
from gymkube_operator.envpool import builders
from gymkube_operator.envpool.models import OPENENV, EnvPoolSpec, WatchdogSpec
from gymkube_operator.envpool.openenv_probe import probe_openenv_server
from gymkube_operator.envpool.watchdog import Failure
from gymkube_operator.settings import OperatorSettings
from openenv.core.generic_client import GenericEnvClient
from openenv_sudoku import openenv_sudoku_server
from pydantic import ValidationError
from router_harness import Proc, Procs
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

pytestmark = pytest.mark.unit

CAPACITY = 2


async def _outcome(ws: ClientConnection) -> str | int | None:
    """ "alive" when the socket still answers, else the close code it got."""
    try:
        await ws.send(json.dumps({"type": "state"}))
        frame = json.loads(await asyncio.wait_for(ws.recv(), 3))
        if frame["type"] == "state":
            return "alive"
        await asyncio.wait_for(ws.recv(), 3)  # the close that follows the error frame
    except ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd else None
    return "no close"


def _pool(procs: Procs) -> tuple[list[Proc], Proc]:
    servers = [procs.start(openenv_sudoku_server(CAPACITY)) for _ in range(2)]
    for server in servers:
        server.wait_ready("/health")
    router = procs.router_for(
        servers,
        "--backend-protocol",
        "openenv",
        "--backend-capacity",
        str(CAPACITY),
        "--ws-create-wait",
        "0.3",
    )
    router.wait_ready()
    return servers, router


def test_openenv_client_plays_through_the_router_and_a_full_pool_refuses(procs: Procs) -> None:
    _, router = _pool(procs)
    clients = [GenericEnvClient(base_url=router.url).sync() for _ in range(2 * CAPACITY + 1)]
    try:
        for seed, client in enumerate(clients[:-1]):
            result = client.reset(seed=seed)
            assert "Sudoku" in result.observation["prompt"]
            assert client.step({"message": "[1 1 1]"}).done in (True, False)
        # Placement spread the sessions by the spec's capacity, so the next one is refused
        # by the router, as OpenEnv's own server refuses at MAX_CONCURRENT_ENVS.
        with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
            clients[-1].reset()
    finally:
        for client in clients:
            client.close()


async def test_a_killed_openenv_server_closes_its_sockets_with_session_lost(procs: Procs) -> None:
    servers, router = _pool(procs)
    url = router.url.replace("http", "ws") + "/ws"
    sockets = [await connect(url) for _ in range(2 * CAPACITY)]
    for seed, ws in enumerate(sockets):
        await ws.send(json.dumps({"type": "reset", "data": {"seed": seed}}))
        assert json.loads(await ws.recv())["type"] == "observation"
    killed_at = time.monotonic()
    servers[0].signal(signal.SIGKILL)
    codes = await asyncio.gather(*(_outcome(ws) for ws in sockets))
    assert time.monotonic() - killed_at < 2
    # Half the sockets were on the killed server; the others still answer.
    assert codes.count(CloseCode.SESSION_LOST) == CAPACITY
    assert codes.count("alive") == CAPACITY
    for ws in sockets:
        await ws.close()


def test_openenv_backends_need_a_capacity() -> None:
    with pytest.raises(ValidationError, match="needs --backend-capacity"):
        RouterSettings(backends=["127.0.0.1:8001"], backend_protocol="openenv")


def _byo_spec() -> EnvPoolSpec:
    return EnvPoolSpec.model_validate(
        {"env": OPENENV, "image": "reg/openenv-sudoku:1", "sessionsPerReplica": 8}
    )


def test_a_byo_pool_runs_the_image_as_an_openenv_server() -> None:
    pool = builders.owner("sudoku", "ns", "uid-1")
    settings = OperatorSettings(envserver_image="reg/envserver:1", router_image="reg/router:1")
    [server] = builders.build_statefulset(pool, _byo_spec(), settings)["spec"]["template"]["spec"][
        "containers"
    ]
    assert server["image"] == "reg/openenv-sudoku:1"
    assert "args" not in server  # the image's own command
    assert {"name": "MAX_CONCURRENT_ENVS", "value": "8"} in server["env"]
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert server[probe]["httpGet"]["path"] == "/health"
    assert "lifecycle" not in server  # no gymkube drain endpoint to call
    [router] = builders.build_router_deployment(pool, _byo_spec(), settings)["spec"]["template"][
        "spec"
    ]["containers"]
    assert router["args"][-4:] == ["--backend-protocol", "openenv", "--backend-capacity", "8"]


async def test_the_watchdog_probe_of_an_openenv_server(procs: Procs) -> None:
    server = procs.start(openenv_sudoku_server(CAPACITY))
    server.wait_ready("/health")
    policy = WatchdogSpec.model_validate(
        {"probeTimeoutSeconds": 1, "canaryIntervalSeconds": 1, "canaryTimeoutSeconds": 5}
    )
    async with aiohttp.ClientSession() as session:
        healthy = await probe_openenv_server(session, server.url, policy)
        assert healthy.failure is None, healthy.message
        server.signal(signal.SIGSTOP)
        try:
            frozen = await probe_openenv_server(session, server.url, policy)
        finally:
            server.signal(signal.SIGCONT)
        assert frozen.failure == Failure.NO_ANSWER
