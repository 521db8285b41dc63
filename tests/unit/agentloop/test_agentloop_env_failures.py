"""How the gymkube_env loop behaves when the env pool fails, is full or cannot be reached."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from agentloop_harness import EnvServer, Router, ScriptedLLM, instantiate_loop, run_row
from gymkube_agentloop.agent_loop import EpisodeExcluded
from gymkube_dev.ports import free_port
from transformers import PreTrainedTokenizerFast

pytestmark = pytest.mark.unit

WINNING_TASK, WINNING_REPLIES = "frozen_lake_3", ["<action>down</action>"] * 2
NO_REPLAY = "  env_client:\n    replay:\n      enabled: false\n"
REFUSED_CREATES = re.compile(
    r'^gymkube_envserver_requests_total\{(?=.*"/create")(?=.*"at_capacity").*\} (\S+)$',
    re.MULTILINE,
)


def post(url: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5) as reply:
        answer: dict[str, object] = json.load(reply)
        return answer


def refused_creates(url: str) -> float:
    """How many /create calls the server has answered 503 at_capacity (from its /metrics)."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return sum(float(m.group(1)) for m in REFUSED_CREATES.finditer(text))


async def test_a_server_killed_mid_episode_ends_the_trajectory_within_two_seconds(
    start_env_server: Callable[..., EnvServer],
    tokenizer: PreTrainedTokenizerFast,
    agent_yaml: Callable[..., Path],
) -> None:
    server = start_env_server("frozen_lake")
    # Replay off: how fast a loss is seen (replays: test_agentloop_replay.py).
    agent_yaml(server.url, NO_REPLAY)
    killed_at: list[float] = []

    def kill_before_second_reply(turn: int) -> None:
        if turn == 1:
            server.kill()
            killed_at.append(time.monotonic())

    llm = ScriptedLLM(tokenizer, ["<action>left</action>"], on_generate=kill_before_second_reply)
    with pytest.raises(EpisodeExcluded) as excluded:
        await run_row(instantiate_loop("gymkube_env", llm, tokenizer), "frozen_lake_5")
    ended_after = time.monotonic() - killed_at[0]

    assert ended_after < 2.0
    # Not a made-up reward of 0 for verl: the episode is left out, and says why.
    assert excluded.value.ending == "env_lost"
    fields = excluded.value.extra_fields
    assert fields["env_ending"] == "env_lost"
    # Whether the kept-alive connection was seen closed before the step was sent is a race.
    reason, _, where = fields["env_detail"].partition(": ")
    assert reason in {"unreachable", "disconnected"}
    assert "/step" in where
    # The step, then one quick attempt at closing the session.
    assert fields["env_errors"] == Counter({reason: 1}) + Counter({"unreachable": 1})


async def test_a_backend_dying_behind_the_router_ends_the_trajectory_as_session_lost(
    start_env_server: Callable[..., EnvServer],
    tokenizer: PreTrainedTokenizerFast,
    agent_yaml: Callable[..., Path],
) -> None:
    backend = start_env_server("frozen_lake")
    router = Router(backend)
    try:
        router.wait_ready(30)
        agent_yaml(router.url, NO_REPLAY)
        killed_at: list[float] = []

        def kill_backend_before_second_reply(turn: int) -> None:
            if turn == 1:
                backend.kill()
                killed_at.append(time.monotonic())

        llm = ScriptedLLM(
            tokenizer, ["<action>left</action>"], on_generate=kill_backend_before_second_reply
        )
        with pytest.raises(EpisodeExcluded) as excluded:
            await run_row(instantiate_loop("gymkube_env", llm, tokenizer), "frozen_lake_5")
        ended_after = time.monotonic() - killed_at[0]
    finally:
        router.kill()

    assert ended_after < 2.0
    assert excluded.value.ending == "env_lost"
    # The router knows the session's backend is gone and says so: 410, no retries.
    assert excluded.value.extra_fields["env_errors"] == {"session_lost": 1}
    assert excluded.value.extra_fields["env_retries"] == {}


async def test_a_full_pool_is_waited_out_as_its_retry_after_says(
    start_env_server: Callable[..., EnvServer],
    tokenizer: PreTrainedTokenizerFast,
    agent_yaml: Callable[..., Path],
) -> None:
    server = start_env_server("frozen_lake", "--max-sessions", "1", "--retry-after", "1")
    agent_yaml(server.url)
    blocker = post(server.url + "/create", {})["id"]
    llm = ScriptedLLM(tokenizer, WINNING_REPLIES)
    started = time.monotonic()
    trajectory = asyncio.create_task(
        run_row(instantiate_loop("gymkube_env", llm, tokenizer), WINNING_TASK)
    )
    # Free the slot as soon as the pool has turned the trajectory's /create away.
    for _ in range(600):
        if await asyncio.to_thread(refused_creates, server.url):
            break
        await asyncio.sleep(0.05)
    post(server.url + "/close", {"id": blocker})
    output = await trajectory

    assert output.extra_fields["env_ending"] == "done"
    assert output.reward_score == 1.0
    assert output.extra_fields["env_retries"] == {"at_capacity": 1}
    assert output.extra_fields["env_errors"] == {}
    # The slot was free right after the refusal, but the pool asked for 1 s between tries.
    assert time.monotonic() - started >= 1.0


async def test_an_unreachable_pool_ends_the_trajectory_after_the_retry_deadline(
    tokenizer: PreTrainedTokenizerFast,
    agent_yaml: Callable[..., Path],
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    agent_yaml(url, "  env_client:\n    retry_deadline_s: 0.5\n")
    llm = ScriptedLLM(tokenizer, WINNING_REPLIES)
    started = time.monotonic()
    with pytest.raises(EpisodeExcluded) as excluded:
        await run_row(instantiate_loop("gymkube_env", llm, tokenizer), WINNING_TASK)

    assert time.monotonic() - started < 2.0
    assert excluded.value.ending == "env_lost"
    assert url in excluded.value.detail
    # The model was never asked: there was no task to show it.
    assert llm.calls == []
