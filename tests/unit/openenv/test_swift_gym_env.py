"""gymkube's ms-swift gym Env plugin, driven by ms-swift's own GYMScheduler hooks."""

from __future__ import annotations

from pathlib import Path

import gymkube_agentloop.swift_env as plugin
import pytest
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


def test_bad_env_config_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="base_url: Field required"):
        plugin.GymkubeEnv({"name": "gymkube"})
    with pytest.raises(ValueError, match="data_idx"):
        plugin.GymkubeEnv({"name": "gymkube", "base_url": "http://pool", "data_idx": -1})


def test_plugin_file_is_self_registering() -> None:
    assert Path(plugin.__file__).read_text().rstrip().endswith("envs[ENV_NAME] = GymkubeEnv")
