"""The operator's own record of the pools' pods: what a list and watch events leave in it."""

from typing import Any

import pytest
from gymkube_operator.envpool.podwatch import PoolPods, Shelf, shelve
from gymkube_operator.labels import COMPONENT_LABEL, POOL_LABEL

pytestmark = pytest.mark.unit


def pod(name: str, component: str, pool: str = "lake", namespace: str = "rl") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "labels": {POOL_LABEL: pool, COMPONENT_LABEL: component, "extra": "x"},
            "managedFields": [{"manager": "kubelet"}],
        },
        "spec": {"containers": [{"name": "envserver", "image": "reg/envserver:1"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.7"},
    }


def names(pods: list[dict[str, Any]]) -> list[str]:
    return sorted(p["metadata"]["name"] for p in pods)


def test_servers_and_routers_by_pool_slimmed_and_synced_after_every_scope_was_listed() -> None:
    seen = PoolPods(["rl", "other"])
    seen.listed("rl", {})
    assert not seen.synced.is_set()
    seen.seen("rl", "ADDED", pod("lake-0", "envserver"))
    seen.seen("rl", "ADDED", pod("lake-router-a", "router"))
    seen.seen("rl", "ADDED", pod("sea-0", "envserver", pool="sea"))
    seen.listed("other", {})
    assert seen.synced.is_set()

    assert names(seen.servers("rl", "lake")) == ["lake-0"]
    assert names(seen.routers("rl", "lake")) == ["lake-router-a"]
    assert names(seen.servers("rl", "sea")) == ["sea-0"]
    assert seen.servers("other", "lake") == []
    (server,) = seen.servers("rl", "lake")
    assert "managedFields" not in server["metadata"]
    assert server["status"]["podIP"] == "10.0.0.7"


def test_a_modified_pod_replaces_its_record_and_a_deleted_one_is_gone() -> None:
    seen = PoolPods([None])
    seen.seen(None, "ADDED", pod("lake-0", "envserver"))
    moved = pod("lake-0", "envserver")
    moved["status"]["podIP"] = "10.0.0.8"
    seen.seen(None, "MODIFIED", moved)
    assert [p["status"]["podIP"] for p in seen.servers("rl", "lake")] == ["10.0.0.8"]
    seen.seen(None, "DELETED", moved)
    assert seen.servers("rl", "lake") == []


def test_a_new_list_replaces_what_the_watch_had_left() -> None:
    seen = PoolPods([None])
    seen.seen(None, "ADDED", pod("lake-0", "envserver"))
    seen.seen(None, "ADDED", pod("lake-1", "envserver"))
    relisted: Shelf = {}
    shelve(relisted, "ADDED", pod("lake-1", "envserver"))
    # As after a watch that could not go on (410 Gone): what the list says, nothing else.
    seen.listed(None, relisted)
    assert names(seen.servers("rl", "lake")) == ["lake-1"]
