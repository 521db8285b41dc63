"""Episodes whose env session is lost are replayed on another server of the pool.

Real env servers behind a real router: a server is killed (SIGKILL) or frozen (SIGSTOP) while it
holds an episode's session, and the episode goes on elsewhere exactly as it would have without
the fault, or fails as lost, saying why, when it cannot be replayed faithfully.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from agentloop_harness import (
    EnvServer,
    Router,
    ScriptedLLM,
    ServerProcess,
    instantiate_loop,
    run_row,
)
from gymkube_agentloop.client import EnvClient, EnvClientSettings, fetch_tasks
from gymkube_agentloop.episode import Ending, EnvEpisode, Turn
from gymkube_agentloop.protocol import ScoreScale
from gymkube_agentloop.settings import AgentLoopSettings
from gymkube_agentloop.templates import BUILTIN_TEMPLATES
from transformers import PreTrainedTokenizerFast
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

pytestmark = pytest.mark.unit

HERE = Path(__file__).parent
QUIET = ("--canary-interval", "0")
# Task 39's 4x4 map: the goal is eight moves from the start, round two holes.
LONG_WALK = "frozen_lake_39"
LONG_WALK_MOVES = ["up", "right", "up", "up", "left", "left", "left", "down"]
LONG_WALK_REPLIES = [f"<action>{move}</action>" for move in LONG_WALK_MOVES]
# find-non-living-thing, variation 0: the agent starts in the hallway.
FIND_NON_LIVING_THING = "sciworld_3236"
SCIWORLD_REPLIES = [
    f"Thought:\nI look for something that is not alive.\n\nAction:\n{action}\n"
    for action in ("look around", "open door to kitchen", "go to kitchen", "look around")
]


def status(server: ServerProcess) -> dict[str, Any]:
    with urllib.request.urlopen(server.url + "/status", timeout=5) as reply:
        answer: dict[str, Any] = json.load(reply)
        return answer


@dataclass
class Pool:
    """Env servers behind a router that has seen them all ready."""

    servers: list[EnvServer]
    router: Router
    frozen: list[EnvServer] = field(default_factory=list)

    def holder(self) -> EnvServer:
        """The live server holding the (one) open session."""
        live = [server for server in self.servers if server.process.poll() is None]
        return next(server for server in live if status(server)["active"])

    def kill_holder_at(self, when: int) -> Callable[[int], None]:
        """A hook for the WHEN-th model turn (or step) that kills the session's server."""

        def kill(now: int) -> None:
            if now == when:
                self.holder().kill()

        return kill

    def freeze(self, server: EnvServer) -> None:
        os.kill(server.process.pid, signal.SIGSTOP)
        self.frozen.append(server)

    def replays(self) -> int:
        """The replays the servers still running have counted."""
        running = [s for s in self.servers if s.process.poll() is None and s not in self.frozen]
        return sum(status(server)["replays"] for server in running)


@pytest.fixture
def env_pool() -> Iterator[Callable[..., Pool]]:
    pools: list[Pool] = []

    def start(env: str, *server_args: Sequence[str]) -> Pool:
        """One server of `env` per entry of server_args (its extra flags), and a router."""
        servers = [EnvServer(env, *QUIET, *args) for args in server_args]
        pool = Pool(servers, Router(*servers))
        pools.append(pool)
        for server in servers:
            server.wait_ready(120)
        pool.router.wait_ready(30)
        deadline = time.monotonic() + 30
        while status(pool.router)["backends_ready"] < len(servers):
            assert time.monotonic() < deadline, "the router did not see every server ready"
            time.sleep(0.05)
        return pool

    yield start
    for pool in pools:
        for server in pool.frozen:
            os.kill(server.process.pid, signal.SIGCONT)
        pool.router.kill()
        for server in pool.servers:
            server.kill()


async def play(
    tokenizer: PreTrainedTokenizerFast,
    item_id: str,
    replies: list[str],
    on_generate: Callable[[int], None] | None = None,
) -> AgentLoopOutput:
    llm = ScriptedLLM(tokenizer, replies, on_generate=on_generate)
    return await run_row(instantiate_loop("gymkube_env", llm, tokenizer), item_id)


def assert_same_episode(replayed: AgentLoopOutput, uninterrupted: AgentLoopOutput) -> None:
    """What verl gets is the same as without the fault: every token, mask bit and the reward."""
    assert replayed.prompt_ids == uninterrupted.prompt_ids
    assert replayed.response_ids == uninterrupted.response_ids
    assert replayed.response_mask == uninterrupted.response_mask
    assert replayed.reward_score == uninterrupted.reward_score
    for key in ("env_ending", "env_score", "env_steps"):
        assert replayed.extra_fields[key] == uninterrupted.extra_fields[key]


def assert_replayed_once(output: AgentLoopOutput, pool: Pool) -> None:
    fields = output.extra_fields
    assert fields["env_replays"] == 1 == pool.replays()
    assert fields["env_replay_canary_failures"] == 0
    assert 0 < fields["env_replay_seconds"] < 10
    assert fields["reward_extra_info"]["env_replays"] == 1.0
    assert fields["reward_extra_info"]["env_replay_canary_failures"] == 0.0
    assert fields["reward_extra_info"]["env_replay_seconds"] == fields["env_replay_seconds"]


async def test_an_episode_whose_server_is_killed_goes_on_on_the_other_server(
    env_pool: Callable[..., Pool],
    tokenizer: PreTrainedTokenizerFast,
    agent_yaml: Callable[..., Path],
) -> None:
    pool = env_pool("frozen_lake", [], [])
    agent_yaml(pool.router.url)

    kill_the_holder = pool.kill_holder_at(3)
    replayed = await play(tokenizer, LONG_WALK, LONG_WALK_REPLIES, kill_the_holder)
    uninterrupted = await play(tokenizer, LONG_WALK, LONG_WALK_REPLIES)

    assert replayed.extra_fields["env_ending"] == "done"
    assert replayed.reward_score == 1.0
    assert_same_episode(replayed, uninterrupted)
    assert_replayed_once(replayed, pool)
    assert replayed.extra_fields["env_errors"] == {"session_lost": 1}
    assert uninterrupted.extra_fields["env_replays"] == 0


async def test_an_episode_on_a_frozen_server_is_replayed_once_the_router_declares_it_dead(
    env_pool: Callable[..., Pool],
    tokenizer: PreTrainedTokenizerFast,
    agent_yaml: Callable[..., Path],
) -> None:
    pool = env_pool("frozen_lake", [], [])
    agent_yaml(pool.router.url)
    frozen_at: list[float] = []

    def freeze_the_holder(turn: int) -> None:
        if turn == 2:
            pool.freeze(pool.holder())
            frozen_at.append(time.monotonic())

    replayed = await play(tokenizer, LONG_WALK, LONG_WALK_REPLIES, freeze_the_holder)
    resumed_after = time.monotonic() - frozen_at[0]
    uninterrupted = await play(tokenizer, LONG_WALK, LONG_WALK_REPLIES)

    assert replayed.extra_fields["env_ending"] == "done"
    assert_same_episode(replayed, uninterrupted)
    assert_replayed_once(replayed, pool)
    # The router's fast polling (two missed polls of 0.5 s) finds the frozen server dead.
    assert resumed_after < 10


async def test_a_sciworld_episode_whose_server_is_killed_goes_on_on_the_other_server(
    env_pool: Callable[..., Pool],
    tokenizer: PreTrainedTokenizerFast,
    agent_yaml: Callable[..., Path],
) -> None:
    one_jvm = ["--warm", "1", "--max-sessions", "2"]
    pool = env_pool("sciworld", one_jvm, one_jvm)
    agent_yaml(pool.router.url, "  max_turns: 4\n")

    kill_the_holder = pool.kill_holder_at(2)
    replayed = await play(tokenizer, FIND_NON_LIVING_THING, SCIWORLD_REPLIES, kill_the_holder)
    uninterrupted = await play(tokenizer, FIND_NON_LIVING_THING, SCIWORLD_REPLIES)

    assert replayed.extra_fields["env_ending"] == "max_turns"
    assert "You move to the kitchen." in tokenizer.decode(replayed.response_ids)
    assert_same_episode(replayed, uninterrupted)
    assert_replayed_once(replayed, pool)


def episode_settings(**replay: Any) -> EnvClientSettings:
    """Client settings as the agent-loop YAML's `env_client: {replay: {...}}` gives them."""
    return AgentLoopSettings(env_url="http://pool", env_client={"replay": replay}).env_client


async def play_episode(
    url: str,
    settings: EnvClientSettings,
    data_idx: int,
    moves: list[str],
    before_step: Callable[[int], None],
) -> tuple[EnvEpisode, list[Turn]]:
    """An episode as the loop and preflight play it; before_step(n) runs before the n-th step."""
    template = BUILTIN_TEMPLATES["frozen_lake"]
    async with EnvEpisode(EnvClient(url, settings), template, data_idx, ScoreScale()) as episode:
        turns = [await episode.start()]
        for number, move in enumerate(moves, 1):
            before_step(number)
            turns.append(await episode.step(f"<action>{move}</action>"))
            if turns[-1].done:
                break
    return episode, turns


def lost(turn: Turn) -> str:
    """The detail of a turn that ended its episode as lost."""
    assert (turn.ending, turn.done) == (Ending.ENV_LOST, True)
    return turn.detail


async def test_the_canary_catches_a_server_whose_reset_differs(
    env_pool: Callable[..., Pool],
) -> None:
    # The two servers' default env_config draws a different map for the same task.
    pool = env_pool("frozen_lake", ["--env-config", '{"seed": 1}'], ["--env-config", '{"seed": 2}'])

    kill_the_holder = pool.kill_holder_at(2)
    episode, turns = await play_episode(
        pool.router.url, EnvClientSettings(), 39, ["up", "up", "up"], kill_the_holder
    )

    assert "replay canary differed at the reset" in lost(turns[-1])
    assert "session_lost" in turns[-1].detail
    assert (episode.replays.replays, episode.replays.canary_failures) == (1, 1)
    assert pool.replays() == 1
    assert episode.reward() == 0.0


async def test_the_canary_catches_an_env_whose_steps_differ_between_servers(
    env_pool: Callable[..., Pool], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(HERE))
    pool = env_pool("plugin:replay_envs:ProcessBoundEnv", [], [])

    kill_the_holder = pool.kill_holder_at(3)
    episode, turns = await play_episode(
        pool.router.url, EnvClientSettings(), 0, ["a", "b", "c"], kill_the_holder
    )

    assert "replay canary differed at step 1" in lost(turns[-1])
    assert len(turns) == 4
    assert (episode.replays.replays, episode.replays.canary_failures) == (1, 1)


async def test_an_env_that_is_not_replayable_is_not_replayed(
    env_pool: Callable[..., Pool], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(HERE))
    pool = env_pool("plugin:replay_envs:UnreplayableEnv", [], [])

    kill_the_holder = pool.kill_holder_at(2)
    episode, turns = await play_episode(
        pool.router.url, EnvClientSettings(), 0, ["a", "b"], kill_the_holder
    )

    detail = lost(turns[-1])
    assert "env plugin:replay_envs:UnreplayableEnv is not replayable" in detail
    assert episode.replays.replays == 0
    assert pool.replays() == 0


async def test_with_replay_turned_off_a_lost_session_ends_the_episode(
    env_pool: Callable[..., Pool],
) -> None:
    pool = env_pool("frozen_lake", [], [])

    kill_the_holder = pool.kill_holder_at(2)
    settings = episode_settings(enabled=False)
    started = time.monotonic()
    episode, turns = await play_episode(
        pool.router.url, settings, 39, LONG_WALK_MOVES, kill_the_holder
    )

    assert time.monotonic() - started < 5
    assert lost(turns[-1]).startswith("session_lost: ")
    assert len(turns) == 3
    assert episode.replays.replays == 0
    assert pool.replays() == 0


async def test_an_episode_is_replayed_at_most_max_replays_times(
    env_pool: Callable[..., Pool],
) -> None:
    pool = env_pool("frozen_lake", [], [], [])
    replays_where_lost: list[int] = []

    def kill_the_holder(step: int) -> None:
        if step in (2, 3):
            holder = pool.holder()
            replays_where_lost.append(status(holder)["replays"])
            holder.kill()

    settings = episode_settings(max_replays=1)
    episode, turns = await play_episode(
        pool.router.url, settings, 39, LONG_WALK_MOVES, kill_the_holder
    )

    assert "no replay left (1 in " in lost(turns[-1])
    assert len(turns) == 4
    # The episode's first server, then the one it was replayed on.
    assert replays_where_lost == [0, 1]
    assert episode.replays.replays == 1
    assert pool.replays() == 0


async def test_replays_stop_at_their_time_budget(
    start_env_server: Callable[..., EnvServer],
) -> None:
    # A lone server, no router: the replay's /create can only meet the same dead server.
    server = start_env_server("frozen_lake", *QUIET)
    await fetch_tasks(server.url)  # as the agent loop has, before its first episode

    def kill(step: int) -> None:
        if step == 2:
            server.kill()

    settings = AgentLoopSettings(
        env_url=server.url, env_client={"lost_after_s": 0.2, "replay": {"budget_s": 1.0}}
    ).env_client
    started = time.monotonic()
    episode, turns = await play_episode(server.url, settings, 39, LONG_WALK_MOVES, kill)

    assert time.monotonic() - started < 5
    assert "replay ran past its budget of 1s" in lost(turns[-1])
    assert episode.replays.replays == 1
    assert 1.0 <= episode.replays.seconds < 2.0
