"""OpenEnv's WebSocket protocol through a real pool Service: an episode over /ws from a pod on
gymkube's env server, a bring-your-own OpenEnv server pool (examples/openenv-sudoku), and OpenEnv's
own client starting pools from outside the cluster through gymkube's provider."""

import json

import pytest
from e2e_cluster import (
    COMPONENT_LABEL,
    ENVSERVER_PORT,
    FAST_WATCHDOG,
    POOL_LABEL,
    Cluster,
    E2ESettings,
    api_path,
    envpool_manifest,
    envserver_selector,
    gymkube_path,
    wait_until,
)
from gymkube_agentloop.openenv_provider import GymkubeProvider, PoolFailed
from openenv.core.generic_client import GenericEnvClient

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


# Runs inside a pod of the bring-your-own image (examples/openenv-sudoku), which carries OpenEnv's
# own client library: one Sudoku episode through the pool URL, exactly as a user's client would.
PLAY_WITH_OPENENV_CLIENT = """
import json
from openenv.core.generic_client import GenericEnvClient
with GenericEnvClient(base_url=URL).sync() as client:
    first = client.reset(seed=3)
    moved = client.step({"message": "[1 1 5]"})
    state = client.state()
print(json.dumps({"prompt": first.observation["prompt"], "done": moved.done,
                  "steps": state["step_count"]}))
"""

# Signals the server process in a bring-your-own pod (not tini, PID 1; not this script).
SIGNAL_SUDOKU_SERVER = """
import os, signal, sys
for entry in os.listdir("/proc"):
    if not entry.isdigit() or int(entry) in (1, os.getpid()):
        continue
    try:
        argv = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\\0")
    except OSError:
        continue
    if any(arg.endswith(b"sudoku_server.py") for arg in argv):
        os.kill(int(entry), getattr(signal, sys.argv[1]))
        sys.exit(0)
sys.exit("no sudoku_server.py process found")
"""


def _play_with_openenv_client(operator: Cluster, namespace: str, pod: str) -> dict[str, object]:
    url = f"http://sudoku.{namespace}.svc:{ENVSERVER_PORT}"
    code = f"URL = {url!r}\n{PLAY_WITH_OPENENV_CLIENT}"
    played: dict[str, object] = json.loads(operator.exec_python(namespace, pod, code))
    return played


def test_bring_your_own_openenv_server_serves_openenv_clients_and_survives_a_freeze(
    operator: Cluster, settings: E2ESettings, namespace: str
) -> None:
    manifest = envpool_manifest(
        "sudoku",
        "openenv",
        2,
        image=settings.image("openenv-sudoku"),
        sessionsPerReplica=4,
        watchdog=FAST_WATCHDOG,
    )
    operator.create(gymkube_path("envpools", namespace), manifest)
    pool = operator.wait_pool_ready(namespace, "sudoku")
    assert pool["status"]["capacity"] == 8, pool["status"]
    victim, survivor = (
        str(p["metadata"]["name"]) for p in operator.pods(namespace, envserver_selector("sudoku"))
    )
    played = _play_with_openenv_client(operator, namespace, survivor)
    assert "Sudoku" in str(played["prompt"])
    assert played["steps"] == 1

    old_uid = str(
        (operator.get(api_path("v1", "pods", namespace, victim)) or {})["metadata"]["uid"]
    )
    operator.kubectl(
        "exec", "-n", namespace, victim, "--", "python3", "-c", SIGNAL_SUDOKU_SERVER, "SIGSTOP"
    )

    def restarted() -> dict[str, object] | None:
        found = operator.get(gymkube_path("envpools", namespace, "sudoku")) or {}
        restarts: dict[str, object] = (found.get("status") or {}).get("restarts") or {}
        return restarts if restarts.get("lastPod") == victim else None

    restarts = wait_until(restarted, timeout=60, what=f"the watchdog to restart frozen {victim}")
    assert restarts["lastReason"] == "NoAnswer"

    def replaced() -> bool:
        current = operator.pod_ready(namespace, victim)
        return current is not None and current["metadata"]["uid"] != old_uid

    wait_until(replaced, timeout=settings.pod_start_timeout_s, what=f"a new {victim} to be Ready")
    operator.wait_pool_ready(namespace, "sudoku", extra=lambda p: p["status"]["readyReplicas"] == 2)
    assert _play_with_openenv_client(operator, namespace, victim)["steps"] == 1


def _provider(
    operator: Cluster, settings: E2ESettings, namespace: str, image: str | None = None
) -> GymkubeProvider:
    return GymkubeProvider(
        namespace,
        image=image,
        api_client=operator.api_client,
        in_cluster=False,
        ready_timeout_s=settings.pool_ready_timeout_s,
    )


def _pools(operator: Cluster, namespace: str) -> list[str]:
    listed = operator.get(gymkube_path("envpools", namespace)) or {}
    return [str(pool["metadata"]["name"]) for pool in listed.get("items", [])]


def test_openenvs_client_starts_an_image_as_a_pool_through_gymkubes_provider(
    operator: Cluster, settings: E2ESettings, namespace: str
) -> None:
    """From this machine, outside the cluster: OpenEnv's from_docker_image with gymkube as its
    provider runs the bring-your-own Sudoku image as a pool, plays through a port the provider
    forwards, and closing the client deletes the pool."""
    provider = _provider(operator, settings, namespace)
    bootstrap = GenericEnvClient.from_docker_image(
        settings.image("openenv-sudoku"), provider=provider, sessions_per_replica=4
    )
    with bootstrap.sync() as env:
        assert str(env.base_url).startswith("http://127.0.0.1:")
        pool = provider.pool
        assert _pools(operator, namespace) == [pool]
        first = env.reset(seed=3)
        assert "Sudoku" in first.observation["prompt"]
        assert env.step({"message": "[1 1 5]"}).done is False
        assert env.state()["step_count"] == 1
    wait_until(lambda: not _pools(operator, namespace), timeout=60, what=f"{pool} deleted")


def test_a_built_in_env_by_name_and_a_bad_image_through_the_provider(
    operator: Cluster, settings: E2ESettings, namespace: str
) -> None:
    lake = _provider(operator, settings, namespace, image="gymkube:frozen_lake")
    with GenericEnvClient(provider=lake).sync() as env:
        first = env.reset(seed=3)
        assert "FrozenLake" in first.observation["task_description"]
        assert env.step({"message": "<action>down</action>"}).metadata["step_count"] == 1
    wait_until(lambda: not _pools(operator, namespace), timeout=60, what="the lake pool deleted")

    missing = "registry.invalid/gymkube/no-such-env:0"
    with pytest.raises(PoolFailed, match=r"is ImagePullFailed: .*no-such-env"):
        GenericEnvClient.from_docker_image(
            missing, provider=_provider(operator, settings, namespace)
        ).sync()
    wait_until(lambda: not _pools(operator, namespace), timeout=60, what="the failed pool deleted")
