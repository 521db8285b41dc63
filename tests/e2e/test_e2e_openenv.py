"""OpenEnv's WebSocket protocol through a real pool Service: an episode over /ws, from a pod."""

import json

import pytest
from e2e_cluster import (
    COMPONENT_LABEL,
    ENVSERVER_PORT,
    POOL_LABEL,
    Cluster,
    envpool_manifest,
    gymkube_path,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

# Runs inside the router pod, whose image carries the websockets client library.
PLAY = """
import asyncio, json
from websockets.asyncio.client import connect
MOVES = ["right", "down", "left", "down", "right", "up"]
async def play(url):
    async with connect(url) as ws:
        async def call(kind, data=None):
            await ws.send(json.dumps({"type": kind, "data": data or {}}))
            return json.loads(await ws.recv())
        first = await call("reset", {"seed": 3})
        for turn in range(40):
            last = await call("step", {"message": f"<action>{MOVES[turn % 6]}</action>"})
            if last["data"]["done"]:
                break
        state = await call("state")
        print(json.dumps({"first": first, "last": last, "state": state}))
asyncio.run(play(URL))
"""


def test_openenv_episode_through_the_pool_service(operator: Cluster, namespace: str) -> None:
    operator.create(gymkube_path("envpools", namespace), envpool_manifest("lake", "frozen_lake", 2))
    operator.wait_pool_ready(namespace, "lake")
    routers = operator.pods(namespace, f"{POOL_LABEL}=lake,{COMPONENT_LABEL}=router")
    url = f"ws://lake.{namespace}.svc:{ENVSERVER_PORT}/ws"
    played = json.loads(
        operator.exec_python(
            namespace, str(routers[0]["metadata"]["name"]), f"URL = {url!r}\n{PLAY}"
        )
    )
    assert "FrozenLake" in played["first"]["data"]["observation"]["task_description"]
    assert played["last"]["type"] == "observation"
    assert played["last"]["data"]["done"] is True
    assert played["state"]["data"]["done"] is True
