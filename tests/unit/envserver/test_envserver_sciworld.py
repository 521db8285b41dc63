"""ScienceWorld on its real JVM behind a real server: AgentGym's data_idx table and client,
warm pool, JVMs given back to the pool on close and on idle expiry, a dead JVM answered with 410
(and closed).

One server for the module (one warm JVM, at most two sessions) keeps the JVM count small."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import requests
from envserver_fixtures import asgi_server, live_server, record_env_starts, wait_until_ready
from fastapi import FastAPI

pytestmark = pytest.mark.unit

IDLE_TIMEOUT_S = 6.0
SKIPPED_BY_AGENTGYM = {
    "mendelian-genetics-known-plant",  # 9-1 .. 9-3 and 10-x are never in AgentGym's table
    "inclined-plane-determine-angle",  # 5-1
    "inclined-plane-friction-named-surfaces",  # 5-2
}


@pytest.fixture(scope="module")
def sciworld() -> Iterator[tuple[str, FastAPI]]:
    with live_server(env="sciworld", max_sessions=2, warm=1, idle_timeout=IDLE_TIMEOUT_S) as (
        url,
        app,
    ):
        wait_until_ready(url)
        yield url, app


@pytest.fixture(scope="module")
def tasks(sciworld: tuple[str, FastAPI]) -> dict:
    return httpx.get(f"{sciworld[0]}/tasks").json()


def jvm_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def session_jvm(app: FastAPI, session: str) -> int:
    """The pid of the JVM behind a session (to check it is freed, or to kill it)."""
    instance = app.state.manager.sessions[session].instance
    return int(instance._env._gateway.java_process.pid)


def wait_for(predicate: object, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise TimeoutError("condition not met in time")


def test_tasks_follow_agentgym_table_and_expose_splits(tasks: dict) -> None:
    assert tasks["env"] == "sciworld"
    assert tasks["count"] == 4639
    assert tasks["score_scale"] == {"min": 0.0, "max": 100.0}
    assert len(tasks["task_names"]) == 23
    assert tasks["task_names"][0] == "boil"
    assert not SKIPPED_BY_AGENTGYM & set(tasks["task_names"])
    starts = [task["first_idx"] for task in tasks["tasks"]]
    assert starts[0] == 0
    assert sum(task["count"] for task in tasks["tasks"]) == 4639
    splits = tasks["splits"]
    assert sorted(splits) == ["dev", "test", "train"]
    assert sorted(splits["train"] + splits["dev"] + splits["test"]) == list(range(4639))
    assert len(splits["train"]) > len(splits["dev"]) > 0


def test_agentgym_sciworld_client_works_unchanged(
    sciworld: tuple[str, FastAPI], tasks: dict
) -> None:
    """Exactly the requests AgentGym's SciworldEnvClient sends (agentenv/envs/sciworld.py)."""
    base = sciworld[0]
    thermometer = next(task for task in tasks["tasks"] if task["name"] == "use-thermometer")
    data_idx = thermometer["first_idx"] + 3

    ok = requests.post(f"{base}/create", timeout=300)
    assert ok.status_code == 200
    env_id = ok.json()["id"]

    res = requests.post(f"{base}/reset", json={"data_idx": data_idx, "id": env_id}, timeout=300)
    assert res.status_code == 200
    response = res.json()
    assert response["task_name"] == "use-thermometer"
    assert response["var_num"] == 3
    assert "thermometer" in response["task_description"]
    first_observation = response["task_description"] + "\n" + response["observation"]
    assert " is called the " in first_observation
    assert (response["reward"], response["score"], response["done"]) == (0, 0, False)

    action = "Thought:\nI should look around.\n\nAction:\nlook around"
    parsed = action.split("Action:")[1].strip()
    res = requests.post(f"{base}/step", json={"action": parsed, "id": env_id}, timeout=300)
    assert res.status_code == 200
    step = res.json()
    assert {"observation", "reward", "score", "done"} <= set(step)
    assert " is called the " in step["observation"]

    res = requests.get(f"{base}/observation?id={env_id}", timeout=300)
    assert res.status_code == 200
    assert res.json() == step["observation"]
    assert requests.post(f"{base}/close", json={"id": env_id}, timeout=300).status_code == 200


def test_first_and_last_data_idx_and_out_of_range(sciworld: tuple[str, FastAPI]) -> None:
    base = sciworld[0]
    with httpx.Client(base_url=base, timeout=300) as client:
        session = client.post("/create").json()["id"]
        first = client.post("/reset", json={"id": session, "data_idx": 0}).json()
        assert (first["task_name"], first["var_num"]) == ("boil", 0)
        last = client.post("/reset", json={"id": session, "data_idx": 4638}).json()
        assert last["task_name"] == "identify-life-stages-2"
        beyond = client.post("/reset", json={"id": session, "data_idx": 4639})
        assert beyond.status_code == 422
        assert "0..4638" in beyond.json()["error"]["message"]
        client.post("/close", json={"id": session})


def pooled_jvms(app: FastAPI) -> set[int]:
    return {int(env.instance._env._gateway.java_process.pid) for env in app.state.manager.warm}


def test_step_limit_ends_the_episode_and_close_gives_the_jvm_back(
    sciworld: tuple[str, FastAPI],
) -> None:
    base, app = sciworld
    with httpx.Client(base_url=base, timeout=300) as client:
        session = client.post("/create", json={"env_config": {"step_limit": 2}}).json()["id"]
        jvm = session_jvm(app, session)
        client.post("/reset", json={"id": session, "data_idx": 10})
        done = False
        for _ in range(4):
            body = client.post("/step", json={"id": session, "action": "wait1"}).json()
            done = body["done"]
            if done:
                break
        assert done
        after = client.post("/step", json={"id": session, "action": "look around"})
        assert after.status_code == 409
        assert after.json()["error"]["code"] == "episode_finished"
        assert jvm_alive(jvm)
        client.post("/close", json={"id": session})
        assert jvm in pooled_jvms(app)
        assert jvm_alive(jvm)


def test_a_dead_jvm_is_reported_as_session_lost(sciworld: tuple[str, FastAPI]) -> None:
    base, app = sciworld
    with httpx.Client(base_url=base, timeout=300) as client:
        wait_for(lambda: client.get("/status").json()["warm"] == 1, timeout_s=120)
        session = client.post("/create").json()["id"]
        client.post("/reset", json={"id": session, "data_idx": 42})
        os.kill(session_jvm(app, session), signal.SIGKILL)
        lost = client.post("/step", json={"id": session, "action": "look around"})
        assert lost.status_code == 410
        assert lost.json()["error"]["code"] == "session_lost"
        detail = client.get("/detail", params={"id": session})
        assert detail.status_code == 404
        assert "lost" in detail.json()["error"]["message"]
        assert client.get("/status").json()["envs_retired"]["failed"] >= 1


async def test_calls_run_off_the_event_loop_and_idle_sessions_give_their_jvm_back(
    sciworld: tuple[str, FastAPI],
) -> None:
    base, app = sciworld
    async with httpx.AsyncClient(base_url=base, timeout=300) as client:
        for _ in range(600):
            if (await client.get("/status")).json()["warm"] == 1:
                break
            await asyncio.sleep(0.2)
        session = (await client.post("/create")).json()["id"]
        jvm = session_jvm(app, session)
        reset = asyncio.create_task(client.post("/reset", json={"id": session, "data_idx": 3000}))
        await asyncio.sleep(0.01)
        health = await client.get("/healthz")
        assert health.status_code == 200
        assert not reset.done(), "a JVM call blocked the event loop"
        assert (await reset).status_code == 200
        await asyncio.sleep(IDLE_TIMEOUT_S + 4)
        expired = await client.post("/step", json={"id": session, "action": "look around"})
        assert expired.status_code == 404
        assert "expired" in expired.json()["error"]["message"]
        assert jvm in pooled_jvms(app)
        assert jvm_alive(jvm)
        status = (await client.get("/status")).json()
        assert status["active"] == 0
        assert status["served"] >= 4


async def test_the_canary_runs_on_a_warm_jvm_and_leaves_it_in_the_pool() -> None:
    """A canary episode costs no JVM start (nor its warm-up): the warm env goes back."""
    async with asgi_server(env="sciworld", warm=1, warm_up_resets=1, canary_interval=0.2) as (
        client,
        app,
    ):
        started = record_env_starts(app.state.manager.backend)
        canaries_seen: set[float] = set()
        for _ in range(600):
            status = (await client.get("/status")).json()
            if status["canary"]["at"] is not None:
                assert status["canary"]["ok"] is True, status["canary"]
                canaries_seen.add(status["canary"]["at"])
            if len(canaries_seen) >= 3:
                break
            await asyncio.sleep(0.1)
        assert len(canaries_seen) >= 3
        assert not started, "the canary made the server start JVMs"
        manager = app.state.manager
        assert len(manager.warm) + manager.pool._lent == 1, "the warm pool over- or under-filled"


def test_the_warm_up_loads_every_task_before_repeating_one(
    sciworld: tuple[str, FastAPI], tasks: dict
) -> None:
    """JIT warm-up covers each task's own world-building code, not variations of a few."""
    backend = sciworld[1].state.manager.backend
    picks = backend.warm_up_entries()
    assert len(picks) == backend.warm_up_resets == 24
    names = [name for name, _ in picks]
    assert sorted(names[:23]) == sorted(tasks["task_names"])
    assert picks[23] == (picks[0][0], 1)


def test_a_client_that_leaves_during_a_cold_create_leaves_no_jvm_behind() -> None:
    """Without a warm env /create starts a JVM; a client that times out meanwhile never learns
    the session id, so the server frees the session at once (its JVM joins the pool)."""
    with live_server(env="sciworld", warm=0, max_sessions=2) as (url, app):
        wait_until_ready(url)
        manager = app.state.manager
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/create", json={}, timeout=httpx.Timeout(5.0, read=0.1))
        wait_for(lambda: manager.served == 1)
        wait_for(lambda: not manager.sessions)
        # A client that waits keeps its session.
        session = httpx.post(f"{url}/create", json={}, timeout=120).json()["id"]
        assert session in manager.sessions
