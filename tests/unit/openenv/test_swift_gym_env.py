"""gymkube's ms-swift gym Env plugin, driven by ms-swift's own GYMScheduler hooks."""

from __future__ import annotations

from pathlib import Path

import gymkube_agentloop.swift_env as plugin
import pytest
from gymkube_agentloop.client import close_shared_session
from router_harness import Procs, active_sessions, wait_all
from swift.infer_engine.protocol import (
    ChatCompletionResponseChoice,
    ChatMessage,
    RolloutInferRequest,
)
from swift.rollout.gym_env import Env, envs
from swift.rollout.multi_turn import GYMScheduler
from swift.utils.utils import import_external_file

pytestmark = pytest.mark.unit

MOVES = ["right", "down", "left", "down", "right", "up"]
# Task 39's 4x4 map: the goal is eight moves from the start.
LONG_WALK = ["up", "right", "up", "up", "left", "left", "left", "down"]


def _choice(text: str) -> ChatCompletionResponseChoice:
    return ChatCompletionResponseChoice(
        index=0, message=ChatMessage(role="assistant", content=text), finish_reason="stop"
    )


async def test_gym_scheduler_plays_pool_episodes_with_a_scripted_model(procs: Procs) -> None:
    # What ``--external_plugins <file>`` runs.
    import_external_file(plugin.__file__)
    assert issubclass(envs[plugin.ENV_NAME], Env)
    backends = [procs.env_server(max_sessions=4), procs.env_server(max_sessions=4)]
    router = procs.router_for(backends)
    wait_all(*backends, router)
    scheduler = GYMScheduler(infer_engine=None, max_turns=30)
    requests = [
        RolloutInferRequest(
            messages=[{"role": "user", "content": "<placeholder>"}],
            data_dict={"env_config": {"name": "gymkube", "base_url": router.url, "data_idx": k}},
            uuid=f"trajectory-{k}",
        )
        for k in range(4)
    ]
    await scheduler.on_trajectory_start(requests)
    assert sum(active_sessions(b) for b in backends) == 4
    for request in requests:
        assert request.messages[0]["role"] == "system"
        assert "FrozenLake" in request.messages[0]["content"]
        assert "row" in request.messages[1]["content"]
    totals = []
    for request in requests:
        for turn in range(30):
            reply = f"<action>{MOVES[turn % 6]}</action>"
            request.messages.append({"role": "assistant", "content": reply})
            result = await scheduler.on_turn_end(request, _choice(reply), turn + 1)
            scheduler.step(request, _choice(reply), turn + 1)
            if result["done"]:
                totals.append(result["rollout_infos"]["total_reward"])
                break
            assert request.messages[-1]["role"] == "user"  # the next observation
    assert len(totals) == 4
    assert all(total in (0.0, 1.0) for total in totals)
    assert sum(active_sessions(b) for b in backends) == 0


async def test_a_trajectory_whose_server_is_killed_is_replayed_on_the_other(procs: Procs) -> None:
    backends = [procs.env_server(max_sessions=2), procs.env_server(max_sessions=2)]
    router = procs.router_for(backends)
    wait_all(*backends, router)
    config = {"name": "gymkube", "base_url": router.url, "data_idx": 39}

    async def play(kill_before: int | None) -> tuple[list[str], dict[str, object]]:
        env = plugin.GymkubeEnv(config)
        observation, _, _ = await env.reset(None)
        seen, info = [observation], {}
        for number, move in enumerate(LONG_WALK, 1):
            if number == kill_before:
                live = [b for b in backends if b.popen is not None and b.popen.poll() is None]
                next(b for b in live if active_sessions(b)).stop()
            reply = [{"role": "assistant", "content": f"<action>{move}</action>"}]
            observation, _, _, info = await env.step(reply)
            seen.append(observation)
        await env.close()
        return seen, info

    try:
        replayed, info = await play(kill_before=4)
        uninterrupted, _ = await play(kill_before=None)
    finally:
        await close_shared_session()
    assert replayed == uninterrupted
    assert "You reached the goal" in replayed[-1]
    assert info["replays"] == 1


def test_bad_env_config_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="base_url: Field required"):
        plugin.GymkubeEnv({"name": "gymkube"})
    with pytest.raises(ValueError, match="data_idx"):
        plugin.GymkubeEnv({"name": "gymkube", "base_url": "http://pool", "data_idx": -1})


def test_plugin_file_is_self_registering() -> None:
    assert Path(plugin.__file__).read_text().rstrip().endswith("envs[ENV_NAME] = GymkubeEnv")
