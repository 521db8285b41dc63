"""gymkube's OpenEnv provider against OpenEnv's own abstract base and client: pure code, no
cluster (the integration tier runs it against a real API server, the e2e suite on kind)."""

from __future__ import annotations

import inspect
import re
from typing import Any

import kubernetes
import pytest
from gymkube_agentloop.openenv_provider import (
    ENVSERVER_CONTAINER,
    STUCK_REASONS,
    GymkubeProvider,
    PoolFailed,
    pool_manifest,
    pool_name,
    readiness,
)
from gymkube_operator.envpool import builders
from gymkube_operator.envpool.models import EnvPoolSpec
from gymkube_operator.envpool.reasons import STUCK
from openenv.core.containers.runtime.providers import ContainerProvider
from openenv.core.env_client import _required_start_container_parameters

pytestmark = pytest.mark.unit

DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def provider(**options: Any) -> GymkubeProvider:
    return GymkubeProvider("ns", api_client=kubernetes.client.ApiClient(), **options)


def test_the_provider_implements_every_abstract_method_of_openenvs_base() -> None:
    assert not inspect.isabstract(GymkubeProvider)
    for name in ContainerProvider.__abstractmethods__:
        assert name in GymkubeProvider.__dict__, name
    made = provider(image="gymkube:frozen_lake")
    assert isinstance(made, ContainerProvider)
    # OpenEnv's EnvClient(provider=...) calls start_container() with no arguments.
    assert _required_start_container_parameters(made) == []


def test_the_provider_fails_on_exactly_the_reasons_the_operator_calls_stuck() -> None:
    assert frozenset(STUCK) == STUCK_REASONS
    assert ENVSERVER_CONTAINER == builders.ENVSERVER_CONTAINER


@pytest.mark.parametrize(
    "image",
    [
        "registry.example:5000/team/Sudoku_Env:1.2",
        "ghcr.io/x/9lives@sha256:" + "a" * 64,
        "gymkube:textarena:Sudoku-v0",
        "gymkube:plugin:my_envs.maze:MazeEnv",
        "___:latest",
    ],
)
def test_pool_names_are_valid_service_names(image: str) -> None:
    name = pool_name(image)
    assert DNS_1035.match(name), name
    assert len(name) <= 63
    assert pool_name(image) != name  # a second pool of the same image gets its own name


def test_an_image_runs_as_an_openenv_pool_with_its_port_and_env_vars() -> None:
    manifest = pool_manifest(
        "sudoku",
        "registry.example/sudoku:1",
        port=8080,
        env_vars={"DIFFICULTY": "easy"},
        replicas=2,
        sessions_per_replica=4,
    )
    spec = EnvPoolSpec.model_validate(manifest["spec"])
    assert (spec.env, spec.image, spec.port) == ("openenv", "registry.example/sudoku:1", 8080)
    assert (spec.replicas, spec.sessions_per_replica) == (2, 4)
    containers = spec.pod_template["containers"]
    assert containers == [
        {"name": ENVSERVER_CONTAINER, "env": [{"name": "DIFFICULTY", "value": "easy"}]}
    ]
    assert manifest["metadata"]["labels"]["app.kubernetes.io/created-by"]


def test_a_gymkube_name_runs_the_built_in_env() -> None:
    manifest = pool_manifest("lake", "gymkube:frozen_lake", env_config={"size": 2})
    spec = EnvPoolSpec.model_validate(manifest["spec"])
    assert (spec.env, spec.image, spec.env_config) == ("frozen_lake", None, {"size": 2})


def pool_status(**conditions: tuple[str, str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "generation": 1},
        "status": {
            "observedGeneration": 1,
            "url": "http://p.ns.svc:8000",
            "conditions": [
                {"type": kind, "status": status, "reason": reason, "message": message}
                for kind, (status, reason, message) in conditions.items()
            ],
        },
    }


def test_a_pool_that_waiting_will_not_fix_fails_in_the_operators_words() -> None:
    pulled = pool_status(
        Ready=("False", "ServersNotReady", "0/1 env servers ready"),
        Degraded=("True", "ImagePullFailed", 'pod p-0: Back-off pulling image "x"'),
    )
    with pytest.raises(PoolFailed, match=r"ns/p is ImagePullFailed: pod p-0: Back-off pulling"):
        readiness(pulled)


def test_a_pool_on_its_way_says_where_it_is() -> None:
    starting = pool_status(
        Ready=("False", "ServersNotReady", "0/1 env servers ready"),
        Degraded=("True", "ProbesFailing", "failing probes: p-0"),
    )
    ready, said = readiness(starting)
    assert not ready
    assert "ServersNotReady: 0/1 env servers ready; ProbesFailing" in said
    unseen = pool_status()
    unseen["status"]["observedGeneration"] = 0
    assert "is gymkube installed?" in readiness(unseen)[1]
    assert readiness(pool_status(Ready=("True", "AllReplicasReady", "1/1")))[0]


def test_bad_calls_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="no image"):
        provider().start_container()
    with pytest.raises(TypeError, match=r"unknown options \['gpus'\]"):
        provider().start_container("gymkube:frozen_lake", gpus=1)
