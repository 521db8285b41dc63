"""gymkube's OpenEnv provider against a real API server and the operator: OpenEnv's own client
starts a pool through it, reads a stuck pool's cause, and the provider removes only its pool."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import pytest
from gymkube_agentloop.openenv_provider import GymkubeProvider, PoolFailed
from gymkube_operator.envpool.builders import selector_string
from openenv.core.generic_client import GenericEnvClient
from operator_support import Cluster, OperatorProcess, envpool, eventually

pytestmark = pytest.mark.integration

# The env-server pods only: the router's carry the pool label too, and may come first.
SUDOKU_SERVERS = selector_string("sudoku")


@contextlib.contextmanager
def kubelet(play: Callable[[], bool]) -> Iterator[None]:
    """Play a kubelet in the background (the control plane has none) while the provider waits."""
    done = threading.Event()

    def run() -> None:
        while not done.is_set() and not play():
            done.wait(0.2)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield
    done.set()
    thread.join()


def test_openenv_reads_why_the_pool_of_an_image_cannot_start_and_the_pool_is_removed(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    cluster.create(envpool("bystander"))
    provider = GymkubeProvider(
        cluster.namespace, api_client=cluster.custom.api_client, in_cluster=True
    )

    def pull_fails() -> bool:
        pods = cluster.core.list_namespaced_pod(cluster.namespace, label_selector=SUDOKU_SERVERS)
        if not pods.items:
            return False
        waiting = {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "nope"'}
        cluster.report_container(pods.items[0].metadata.name, {"state": {"waiting": waiting}})
        return True

    stuck = r"is ImagePullFailed: .*Back-off pulling image"
    with kubelet(pull_fails), pytest.raises(PoolFailed, match=stuck):
        GenericEnvClient.from_docker_image(
            "reg.example/sudoku:nope", provider=provider, name="sudoku"
        ).sync()
    # OpenEnv stops the provider's container when its start fails: the pool goes, nothing else.
    eventually("the failed pool deleted", lambda: True if cluster.get("sudoku") is None else None)
    assert cluster.get("bystander") is not None


def test_a_built_in_env_by_name_inside_the_cluster_gets_the_pool_url(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    provider = GymkubeProvider(
        cluster.namespace, api_client=cluster.custom.api_client, in_cluster=True
    )
    with kubelet(lambda: cluster.mark_pods_ready("gymkube.io/envpool=lake") == 2):
        url = provider.start_container("gymkube:frozen_lake", name="lake", env_config={"size": 2})
    assert url == f"http://lake.{cluster.namespace}.svc:8000"
    pool = cluster.get("lake")
    assert pool is not None
    assert (pool["spec"]["env"], pool["spec"]["envConfig"]) == ("frozen_lake", {"size": 2})
    with pytest.raises(RuntimeError, match="already runs EnvPool lake"):
        provider.start_container("gymkube:frozen_lake")
    provider.stop_container()
    eventually("the pool deleted", lambda: True if cluster.get("lake") is None else None)
    provider.stop_container()  # a second stop is a no-op
