"""Plugin envs with ms-swift's Env shape: history kept by the server, calls serialised."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator

import pytest
from envserver_fixtures import HERE, asgi_client, asgi_server, settings
from gymkube_envserver.envs import EnvSpecError, load_backend

pytestmark = pytest.mark.unit

PLUGIN = "plugin:example_plugin_env:GuessNumberEnv"


@pytest.fixture(autouse=True)
def plugin_importable(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.syspath_prepend(str(HERE))
    yield
    sys.modules.pop("example_plugin_env", None)


def plugin_class() -> type:
    return sys.modules["example_plugin_env"].GuessNumberEnv  # type: ignore[no-any-return]


async def test_steps_get_the_whole_conversation_and_score_sums_rewards() -> None:
    async with asgi_client(env=PLUGIN) as client:
        session = (await client.post("/create", json={"env_config": {"high": 4}})).json()["id"]
        reset = (await client.post("/reset", json={"id": session, "seed": 11})).json()
        assert reset["task_description"].startswith("Guess my number between 1 and 4")
        assert reset["system_message"] == reset["task_description"]
        answers = []
        for guess in range(1, 5):
            action = f"<guess>{guess}</guess>"
            body = (await client.post("/step", json={"id": session, "action": action})).json()
            answers.append(body)
            if body["done"]:
                break
        assert answers[-1]["observation"] == "Correct!"
        assert answers[-1]["score"] == 1.0
        last = plugin_class().last_messages
        assert [message["role"] for message in last[:3]] == ["system", "user", "assistant"]
        assert last[1]["content"] == "I picked a number."
        assert last[-1] == {"role": "assistant", "content": f"<guess>{len(answers)}</guess>"}
        assert len(last) == 2 + 2 * len(answers) - 1


async def test_a_plugin_env_serves_later_sessions_with_its_env_config_only() -> None:
    """Plugins take env_config in their constructor: a given-back env goes only to a session
    with the env_config it was built with, and its reset starts a fresh episode."""
    async with asgi_server(env=PLUGIN, warm=0) as (client, app):
        manager = app.state.manager
        first = (await client.post("/create", json={"env_config": {"high": 4}})).json()["id"]
        env = manager.sessions[first].instance
        await client.post("/reset", json={"id": first, "seed": 11})
        await client.post("/step", json={"id": first, "action": "<guess>1</guess>"})
        closed_before = plugin_class().closed
        await client.post("/close", json={"id": first})
        other = (await client.post("/create", json={"env_config": {"high": 9}})).json()["id"]
        assert manager.sessions[other].instance is not env
        again = (await client.post("/create", json={"env_config": {"high": 4}})).json()["id"]
        assert manager.sessions[again].instance is env
        reset = (await client.post("/reset", json={"id": again, "seed": 11})).json()
        assert reset["task_description"].startswith("Guess my number between 1 and 4")
        await client.post("/step", json={"id": again, "action": "<guess>2</guess>"})
        assert len(plugin_class().last_messages) == 3, "the earlier episode's turns leaked"
        assert plugin_class().closed == closed_before
        status = (await client.get("/status")).json()
        assert (status["envs_started"], status["envs_reused"]) == (2, 1)


async def test_a_plugin_that_declares_itself_not_reusable_is_closed_with_its_session() -> None:
    async with asgi_server(env=f"{PLUGIN}Once", warm=0) as (client, app):
        session = (await client.post("/create")).json()["id"]
        env = app.state.manager.sessions[session].instance
        single_use = sys.modules["example_plugin_env"].GuessNumberEnvOnce
        closed_before = single_use.closed
        await client.post("/close", json={"id": session})
        await asyncio.sleep(0.05)
        assert single_use.closed == closed_before + 1
        session = (await client.post("/create")).json()["id"]
        assert app.state.manager.sessions[session].instance is not env
        status = (await client.get("/status")).json()
        assert status["envs_reused"] == 0
        assert status["envs_retired"] == {"not_reused": 1}


async def test_one_sessions_calls_are_serialised_while_sessions_run_in_parallel() -> None:
    async with asgi_client(env=PLUGIN, warm=0) as client:
        config = {"env_config": {"step_delay_s": 0.05, "high": 1000}}
        sessions = [(await client.post("/create", json=config)).json()["id"] for _ in range(2)]
        for session in sessions:
            await client.post("/reset", json={"id": session, "seed": 1})
        plugin = plugin_class()
        plugin.most_concurrent_steps = 0

        async def step(session: str) -> int:
            response = await client.post(
                "/step", json={"id": session, "action": "<guess>0</guess>"}
            )
            return response.status_code

        statuses = await asyncio.gather(*(step(sessions[0]) for _ in range(4)))
        assert statuses == [200] * 4
        assert plugin.most_concurrent_steps == 1
        await asyncio.gather(*(step(session) for session in sessions))
        assert plugin.most_concurrent_steps == 2


async def test_warm_plugin_envs_are_built_with_the_servers_default_env_config() -> None:
    async with asgi_server(env=PLUGIN, warm=1, env_config={"high": 4}) as (client, app):
        ((warm_env),) = [env.instance for env in app.state.manager.warm]
        session = (await client.post("/create")).json()["id"]
        assert app.state.manager.sessions[session].instance is warm_env
        reset = (await client.post("/reset", json={"id": session, "seed": 3})).json()
        assert reset["task_description"].startswith("Guess my number between 1 and 4")
        # Other keys need an env built for them: the warm ones were built without them.
        other = (await client.post("/create", json={"env_config": {"high": 6}})).json()["id"]
        reset = (await client.post("/reset", json={"id": other, "seed": 3})).json()
        assert reset["task_description"].startswith("Guess my number between 1 and 6")


def test_classes_without_the_env_shape_are_refused() -> None:
    with pytest.raises(EnvSpecError, match="no class"):
        load_backend(settings(env="plugin:example_plugin_env:Missing"))
    with pytest.raises(EnvSpecError, match="cannot import"):
        load_backend(settings(env="plugin:no_such_module_here:Env"))
    with pytest.raises(EnvSpecError, match="lacks async reset, step, close"):
        load_backend(settings(env="plugin:json:JSONDecoder"))


async def test_an_env_call_that_hangs_loses_its_session_instead_of_hanging() -> None:
    async with asgi_client(env=PLUGIN, warm=0, call_timeout=0.3) as client:
        config = {"env_config": {"step_delay_s": 30}}
        session = (await client.post("/create", json=config)).json()["id"]
        await client.post("/reset", json={"id": session, "seed": 2})
        hung = await client.post("/step", json={"id": session, "action": "<guess>1</guess>"})
        assert hung.status_code == 410
        assert "did not answer within 0.3 s" in hung.json()["error"]["message"]
        after = await client.post("/step", json={"id": session, "action": "<guess>1</guess>"})
        assert after.status_code == 404
        assert "lost" in after.json()["error"]["message"]
        assert (await client.get("/status")).json()["active"] == 0


@pytest.mark.parametrize(("suffix", "replayable"), [("", True), ("Unreplayable", False)])
async def test_a_plugin_says_whether_it_is_replayable(suffix: str, replayable: bool) -> None:
    async with asgi_client(env=f"{PLUGIN}{suffix}") as client:
        assert (await client.get("/tasks")).json()["replayable"] is replayable
