"""Envs outlive their sessions: a clean close gives the env back for the next /create, and only a
failed, over-quota or bloated env is closed. ScienceWorld cases run real JVMs."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from envserver_fixtures import asgi_client, asgi_server
from fastapi import FastAPI

pytestmark = pytest.mark.unit

# Two tasks whose worlds read differently in a JVM that played other tasks unless identity
# hashes are constant (melt lists its paint cups in hash-set order).
MELT_VARIATION = 1
BOIL_VARIATION = 3
ACTIONS = ["open door to kitchen", "go to kitchen", "look around", "open freezer", "look around"]


def jvm_of(app: FastAPI, session: str) -> int:
    return int(app.state.manager.sessions[session].instance._env._gateway.java_process.pid)


def warm_jvms(app: FastAPI) -> set[int]:
    return {int(env.instance._env._gateway.java_process.pid) for env in app.state.manager.warm}


async def wait_for(predicate: Any, timeout_s: float = 120.0) -> None:
    for _ in range(round(timeout_s / 0.05)):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise TimeoutError("condition not met in time")


async def status(client: httpx.AsyncClient) -> dict[str, Any]:
    return (await client.get("/status")).json()  # type: ignore[no-any-return]


async def play(client: httpx.AsyncClient, session: str, data_idx: int) -> list[dict[str, Any]]:
    """The reset and every step answer of one scripted episode."""
    reset = await client.post("/reset", json={"id": session, "data_idx": data_idx})
    answers = [reset.raise_for_status().json()]
    for action in ACTIONS:
        step = await client.post("/step", json={"id": session, "action": action})
        answers.append(step.raise_for_status().json())
    for answer in answers:
        answer.pop("id", None)
    return answers


# FrozenLake: cheap, so the pool bookkeeping is checked on many sessions.


async def test_a_batch_after_the_first_gets_only_given_back_envs() -> None:
    async with asgi_client(warm=2, max_sessions=8) as client:
        for _ in range(3):
            sessions = [(await client.post("/create")).json()["id"] for _ in range(8)]
            for number, session in enumerate(sessions):
                await client.post("/reset", json={"id": session, "seed": number})
                await client.post("/step", json={"id": session, "action": "<action>up</action>"})
            for session in sessions:
                await client.post("/close", json={"id": session})
        await asyncio.sleep(0.1)
        counts = await status(client)
        # 2 warm + 6 started by the first batch; the later batches start nothing.
        assert counts["envs_started"] == 8
        assert counts["envs_reused"] == 16
        assert counts["warm"] == 8
        assert counts["envs_retired"] == {}
        metrics = (await client.get("/metrics")).text
        assert "gymkube_envserver_envs_started_total 8.0" in metrics
        assert "gymkube_envserver_envs_reused_total 16.0" in metrics
        assert 'gymkube_envserver_envs_retired_total{reason="failed"} 0.0' in metrics


async def test_a_given_back_env_keeps_nothing_of_its_sessions_env_config() -> None:
    async with asgi_server(warm=0, max_sessions=1) as (client, app):
        big = (await client.post("/create", json={"env_config": {"size": 8}})).json()["id"]
        lake = app.state.manager.sessions[big].instance
        first = (await client.post("/reset", json={"id": big, "seed": 3})).json()
        assert "FrozenLake 8x8" in first["task_description"]
        await client.post("/close", json={"id": big})
        plain = (await client.post("/create")).json()["id"]
        assert app.state.manager.sessions[plain].instance is lake
        second = (await client.post("/reset", json={"id": plain, "seed": 3})).json()
        assert "FrozenLake 4x4" in second["task_description"]


async def test_reuse_off_closes_every_env_with_its_session() -> None:
    async with asgi_server(warm=1, reuse=False) as (client, app):
        session = (await client.post("/create")).json()["id"]
        await client.post("/close", json={"id": session})
        await wait_for(lambda: app.state.manager.warm)
        counts = await status(client)
        assert (counts["envs_started"], counts["envs_reused"]) == (2, 0)
        assert counts["envs_retired"] == {"not_reused": 1}


async def test_a_draining_server_closes_the_envs_sessions_give_back() -> None:
    async with asgi_server(warm=1) as (client, _):
        session = (await client.post("/create")).json()["id"]
        await client.post("/admin/drain")
        await client.post("/close", json={"id": session})
        assert (await status(client))["envs_retired"] == {"draining": 1}


async def test_an_env_over_its_episode_quota_is_replaced_in_the_background() -> None:
    async with asgi_server(warm=1, recycle_after_episodes=3) as (client, app):
        manager = app.state.manager
        session = (await client.post("/create")).json()["id"]
        env = manager.sessions[session].instance
        for seed in range(2):
            await client.post("/reset", json={"id": session, "seed": seed})
        await client.post("/close", json={"id": session})  # 2 episodes: kept
        session = (await client.post("/create")).json()["id"]
        assert manager.sessions[session].instance is env
        await client.post("/reset", json={"id": session, "seed": 2})
        await client.post("/close", json={"id": session})  # 3 episodes: recycled
        await wait_for(lambda: len(manager.warm) == 2)
        assert env not in [idle.instance for idle in manager.warm]
        counts = await status(client)
        assert counts["envs_retired"] == {"episodes": 1}
        # The first warm env, the one refilled when it was taken, and the replacement.
        assert counts["envs_started"] == 3


async def test_an_env_whose_call_failed_is_replaced_in_the_background() -> None:
    async with asgi_server(warm=1, max_sessions=4) as (client, app):
        manager = app.state.manager
        broken, healthy = [(await client.post("/create")).json()["id"] for _ in range(2)]
        await wait_for(lambda: len(manager.warm) == 1)  # the pool refilled what they took
        failing = manager.sessions[broken].instance

        async def fail(action: str) -> Any:
            raise RuntimeError("the env broke")

        failing.step = fail
        for session in (broken, healthy):
            await client.post("/reset", json={"id": session, "seed": 1})
        answer = await client.post("/step", json={"id": broken, "action": "<action>up</action>"})
        assert answer.status_code == 500
        for session in (broken, healthy):
            await client.post("/close", json={"id": session})
        # Three envs existed besides the failed one's replacement: all three are idle again.
        await wait_for(lambda: len(manager.warm) == 3)
        assert failing not in [idle.instance for idle in manager.warm]
        counts = await status(client)
        assert counts["envs_retired"] == {"failed": 1}
        assert counts["envs_started"] == 4


async def test_a_session_that_plays_on_trades_its_env_at_a_reset_once_it_is_due() -> None:
    async with asgi_server(warm=1, max_sessions=2, recycle_after_episodes=2) as (client, app):
        manager = app.state.manager
        session = (await client.post("/create")).json()["id"]
        await wait_for(lambda: len(manager.warm) == 1)
        worn = manager.sessions[session].instance
        (idle,) = [env.instance for env in manager.warm]
        for seed in range(2):
            await client.post("/reset", json={"id": session, "seed": seed})
        assert manager.sessions[session].instance is worn
        third = await client.post("/reset", json={"id": session, "seed": 5})
        assert third.status_code == 200
        # Its third episode plays on the idle env; the worn one is closed and replaced.
        assert manager.sessions[session].instance is idle
        await wait_for(lambda: len(manager.warm) == 1)
        assert (await status(client))["envs_retired"] == {"episodes": 1}
        step = await client.post("/step", json={"id": session, "action": "<action>up</action>"})
        assert step.status_code == 200


async def test_a_due_env_stays_with_its_session_when_no_idle_env_can_take_over() -> None:
    async with asgi_server(warm=0, max_sessions=1, recycle_after_episodes=1) as (client, app):
        manager = app.state.manager
        session = (await client.post("/create")).json()["id"]
        env = manager.sessions[session].instance
        for seed in range(3):
            answer = await client.post("/reset", json={"id": session, "seed": seed})
            assert answer.status_code == 200
        assert manager.sessions[session].instance is env
        await client.post("/close", json={"id": session})
        assert (await status(client))["envs_retired"] == {"episodes": 1}


# ScienceWorld: the real JVM.


async def test_a_reused_jvm_plays_each_task_exactly_as_a_new_jvm() -> None:
    """Two JVMs each play one task new, then (after the warm-up the pool gives a JVM a session
    started cold) swap tasks: every answer of the replay equals the new JVM's for that data_idx."""
    async with asgi_server(env="sciworld", warm=0, max_sessions=2) as (client, app):
        tasks = (await client.get("/tasks")).json()
        first_idx = {task["name"]: task["first_idx"] for task in tasks["tasks"]}
        melt = first_idx["melt"] + MELT_VARIATION
        boil = first_idx["boil"] + BOIL_VARIATION
        one, two = [(await client.post("/create")).json()["id"] for _ in range(2)]
        jvm_one, jvm_two = jvm_of(app, one), jvm_of(app, two)
        new_melt = await play(client, one, melt)
        new_boil = await play(client, two, boil)
        await client.post("/close", json={"id": two})
        await client.post("/close", json={"id": one})
        three, four = [(await client.post("/create")).json()["id"] for _ in range(2)]
        assert {jvm_of(app, three), jvm_of(app, four)} == {jvm_one, jvm_two}
        # Started cold for their first sessions, both ran the pool's warm-up on the way back.
        assert all(app.state.manager.sessions[s].env.warmed for s in (three, four))
        after_melt = three if jvm_of(app, three) == jvm_one else four
        after_boil = four if after_melt == three else three
        assert await play(client, after_melt, boil) == new_boil
        assert await play(client, after_boil, melt) == new_melt
        counts = await status(client)
        assert (counts["envs_started"], counts["envs_reused"]) == (2, 2)


async def test_a_jvm_whose_call_failed_is_never_reused_and_is_replaced() -> None:
    async with asgi_server(env="sciworld", warm=0, warm_up_resets=1, max_sessions=1) as (
        client,
        app,
    ):
        session = (await client.post("/create")).json()["id"]
        jvm = jvm_of(app, session)
        bad = await client.post(
            "/reset",
            json={"id": session, "data_idx": 0, "env_config": {"simplifications": "no-such"}},
        )
        assert bad.status_code == 500
        assert bad.json()["error"]["code"] == "env_failure"
        # The session itself stays usable ...
        ok = await client.post("/reset", json={"id": session, "data_idx": 0})
        assert ok.status_code == 200
        await client.post("/close", json={"id": session})
        # ... but its JVM serves no one after it: a new one takes its place in the pool.
        assert jvm not in warm_jvms(app)
        await wait_for(lambda: len(app.state.manager.warm) == 1)
        assert jvm not in warm_jvms(app)
        session = (await client.post("/create")).json()["id"]
        assert jvm_of(app, session) != jvm
        counts = await status(client)
        assert counts["envs_retired"] == {"failed": 1}
        assert counts["envs_reused"] == 0


async def test_a_jvm_is_recycled_after_its_episode_quota_and_over_its_memory_bound() -> None:
    async with asgi_server(
        env="sciworld", warm=1, warm_up_resets=1, max_sessions=1, recycle_after_episodes=2
    ) as (client, app):
        manager = app.state.manager
        session = (await client.post("/create")).json()["id"]
        jvm = jvm_of(app, session)
        await client.post("/reset", json={"id": session, "data_idx": 5})
        await client.post("/close", json={"id": session})
        session = (await client.post("/create")).json()["id"]
        assert jvm_of(app, session) == jvm
        await client.post("/reset", json={"id": session, "data_idx": 6})
        await client.post("/close", json={"id": session})
        await wait_for(lambda: len(manager.warm) == 1 and not manager.pool._closing)
        session = (await client.post("/create")).json()["id"]
        assert jvm_of(app, session) != jvm
        assert (await status(client))["envs_retired"] == {"episodes": 1}
        # A bound below any JVM's size: at the next reset the session trades its JVM for the
        # idle one, and that one is closed when the session ends.
        await wait_for(lambda: len(manager.warm) == 1)
        bloated = jvm_of(app, session)
        manager.settings.recycle_rss_mib = 1
        await client.post("/reset", json={"id": session, "data_idx": 7})
        assert jvm_of(app, session) != bloated
        await client.post("/close", json={"id": session})
        assert (await status(client))["envs_retired"] == {"episodes": 1, "memory": 2}
