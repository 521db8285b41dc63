"""OpenEnv's own client and ms-swift 4.6.0's OpenEnv path, unchanged, against a pool URL."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from openenv.core.generic_client import GenericEnvClient
from router_harness import Procs, active_sessions, wait_all
from swift.infer_engine.protocol import (
    ChatCompletionResponseChoice,
    ChatMessage,
    RolloutInferRequest,
)
from swift.rollout.multi_turn import OpenEnvScheduler
from swift.rollout.openenv_wrapper import OpenEnvWrapper

pytestmark = pytest.mark.unit

MOVES = ["right", "down", "left", "down", "right", "up"]
SUDOKU = "textarena:Sudoku-v0"


def test_openenv_client_plays_frozen_lake_through_the_router(procs: Procs) -> None:
    backends = [procs.env_server(max_sessions=4), procs.env_server(max_sessions=4)]
    router = procs.router_for(backends)
    wait_all(*backends, router)
    with GenericEnvClient(base_url=router.url).sync() as env:
        first = env.reset(seed=5)
        assert "FrozenLake" in first.observation["task_description"]
        assert first.done is False
        for turn in range(40):
            result = env.step({"message": f"<action>{MOVES[turn % 6]}</action>"})
            if result.done:
                break
        assert result.done, "episode did not end"
        assert result.reward in (0.0, 1.0)
        state = env.state()
        assert state["step_count"] == turn + 1
        assert state["done"] is True
        # A second episode on the same socket: the connection is the session.
        again = env.reset(seed=6)
        assert again.done is False
    assert sum(active_sessions(b) for b in backends) == 0


def test_openenv_client_plays_sudoku_and_keeps_its_socket_after_errors(procs: Procs) -> None:
    backend = procs.env_server(max_sessions=2, env=SUDOKU)
    router = procs.router_for([backend])
    wait_all(backend, router)
    with GenericEnvClient(base_url=router.url).sync() as env:
        board = env.reset(seed=1).observation["prompt"]
        assert "R1" in board or "C1" in board or "|" in board
        moved = env.step({"message": "[1 1 1]"})
        assert isinstance(moved.observation["prompt"], str)
        assert moved.metadata is not None
        assert "score" in moved.metadata
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            env.step({"text": "no message key"})
        # Per-message errors leave the session open (OpenEnv's server does the same).
        assert env.state()["step_count"] == 1


def test_openenv_http_endpoints_through_the_router(procs: Procs) -> None:
    backend = procs.env_server(max_sessions=2)
    router = procs.router_for([backend])
    wait_all(backend, router)
    assert httpx.get(router.url + "/health").json() == {"status": "healthy"}
    assert httpx.get(router.url + "/metadata").json()["name"] == "frozen_lake"
    schema = httpx.get(router.url + "/schema").json()
    assert schema["action"]["required"] == ["message"]


def test_websocket_and_http_sessions_share_capacity(procs: Procs) -> None:
    backend = procs.env_server(max_sessions=2)
    router = procs.router_for([backend], "--ws-create-wait", "0.3", "--create-wait", "0.3")
    wait_all(backend, router)
    http_session = httpx.post(router.url + "/create").json()["id"]
    with GenericEnvClient(base_url=router.url).sync() as env:
        env.reset(seed=0)
        assert active_sessions(backend) == 2
        refused = httpx.post(router.url + "/create")
        assert refused.status_code == 503
        assert refused.headers["Retry-After"]
        with (
            GenericEnvClient(base_url=router.url).sync() as extra,
            pytest.raises(RuntimeError, match="CAPACITY_REACHED"),
        ):
            extra.reset()
    httpx.post(router.url + "/close", json={"id": http_session})


def test_a_socket_placed_on_a_server_that_filled_up_since_the_last_poll_goes_elsewhere(
    procs: Procs,
) -> None:
    filled, spare = procs.env_server(max_sessions=2), procs.env_server(max_sessions=1)
    # Polled once at start, then not for 30 s: the router believes `filled` has 2 free slots.
    router = procs.router_for(
        [filled, spare], "--poll-interval", "30", "--ws-create-wait", "0.3", fast_polling=False
    )
    wait_all(filled, spare, router)
    direct = [GenericEnvClient(base_url=filled.url).sync() for _ in range(2)]
    routed = [GenericEnvClient(base_url=router.url).sync() for _ in range(2)]
    try:
        for env in direct:
            env.reset(seed=0)
        routed[0].reset(seed=1)
        assert (active_sessions(filled), active_sessions(spare)) == (2, 1)
        with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
            routed[1].reset()
    finally:
        for env in direct + routed:
            env.close()


def _row(base_url: str) -> dict[str, object]:
    """The guide's dataset row, with base_url pointing at the pool."""
    return {
        "messages": [{"role": "user", "content": "Play"}],
        "env_config": {"name": "openenv", "base_url": base_url},
    }


def test_ms_swift_openenv_wrapper_plays_sudoku_through_the_router(procs: Procs) -> None:
    backend = procs.env_server(max_sessions=2, env=SUDOKU)
    router = procs.router_for([backend])
    wait_all(backend, router)
    wrapper = OpenEnvWrapper(_row(router.url)["env_config"])  # type: ignore[arg-type]
    observation, _ = wrapper.reset()
    assert "prompt" in observation
    _, reward, done, _ = wrapper.step({"message": "[1 1 1]"})
    assert isinstance(reward, float)
    assert done in (True, False)
    wrapper.close()


async def test_ms_swift_openenv_scheduler_hooks_play_frozen_lake(procs: Procs) -> None:
    """OpenEnvScheduler's own hooks with a scripted model: reset, turns, rewards, close."""
    backends = [procs.env_server(max_sessions=4), procs.env_server(max_sessions=4)]
    router = procs.router_for(backends)
    wait_all(*backends, router)
    scheduler = OpenEnvScheduler(infer_engine=None, max_turns=30)
    requests = [
        RolloutInferRequest(
            messages=[{"role": "user", "content": "Play"}], data_dict=_row(router.url), uuid=str(n)
        )
        for n in range(3)
    ]
    await scheduler.on_trajectory_start(requests)
    for request in requests:
        assert json.loads(request.messages[-1]["content"])["prompt"]
    outcomes = []
    for request in requests:
        for turn in range(30):
            reply = f"<action>{MOVES[turn % 6]}</action>"
            choice = ChatCompletionResponseChoice(
                index=0, message=ChatMessage(role="assistant", content=reply), finish_reason="stop"
            )
            request.messages.append({"role": "assistant", "content": reply})
            result = await scheduler.on_turn_end(request, choice, turn + 1)
            scheduler.step(request, choice, turn + 1)
            if result["done"]:
                outcomes.append(result["rollout_infos"])
                break
    assert len(outcomes) == 3
    assert all(info["gym_done"] and info["total_reward"] in (0.0, 1.0) for info in outcomes)
    await asyncio.sleep(0.2)
    assert sum(active_sessions(b) for b in backends) == 0


def test_step_before_reset_says_a_connection_is_a_session(procs: Procs) -> None:
    backend = procs.env_server(max_sessions=2)
    wait_all(backend)
    with (
        GenericEnvClient(base_url=backend.url).sync() as env,
        pytest.raises(RuntimeError, match="EXECUTION_ERROR") as refused,
    ):
        env.step({"message": "<action>up</action>"})
    assert "must reset again" in str(refused.value)
