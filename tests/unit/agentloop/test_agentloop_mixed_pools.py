"""A run over several pools, on the agent-loop side: gymkube-dataset's rows of two real pools (a
FrozenLake and a TextArena server), each played on its own row's pool through the agent-loop YAML's
env_urls, and each episode logged under its pool, so the per-pool figures gymkube-train prints
are each pool's own episode counts."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from agentloop_harness import EnvServer, ScriptedLLM, instantiate_loop, run_row
from gymkube_agentloop.agent_loop import EpisodeExcluded
from gymkube_agentloop.dataset import build_rows
from gymkube_agentloop.episode_log import EPISODE_LOG_ENV, EpisodeRecord
from gymkube_agentloop.protocol import TasksReply
from gymkube_agentloop.templates import BUILTIN_TEMPLATES
from gymkube_agentloop.train import StepEpisodes
from transformers import PreTrainedTokenizerFast

pytestmark = pytest.mark.unit

GAME = "textarena:Sudoku-v0"
POOLS = {"lake": "frozen_lake", "sudoku": GAME}


@pytest.fixture(scope="module")
def servers(frozen_lake: EnvServer) -> Iterator[dict[str, EnvServer]]:
    game = EnvServer(GAME)
    try:
        game.wait_ready(60)
        yield {"lake": frozen_lake, "sudoku": game}
    finally:
        game.kill()


def served(server: EnvServer) -> int:
    with urllib.request.urlopen(f"{server.url}/status", timeout=10) as answer:
        count: int = json.load(answer)["served"]
    return count


def tasks(server: EnvServer) -> TasksReply:
    with urllib.request.urlopen(f"{server.url}/tasks", timeout=10) as answer:
        return TasksReply.model_validate(json.load(answer))


def reply_for(prompt: str) -> str:
    """A move each env takes: a Sudoku cell, a step on the lake."""
    return "[1 1 1]" if "Sudoku" in prompt else "<action>down</action>"


@pytest.fixture
def mixed_loop(
    servers: dict[str, EnvServer], agent_yaml: Callable[..., Path]
) -> Callable[[PreTrainedTokenizerFast], Any]:
    urls = "".join(f"\n    {pool}: {server.url}" for pool, server in servers.items())
    # env_url is the first pool's, as the operator renders it; env_urls route each row.
    agent_yaml(servers["lake"].url, f"  max_turns: 2\n  env_urls:{urls}\n")

    def build(tokenizer: PreTrainedTokenizerFast) -> Any:
        return instantiate_loop("gymkube_env", ScriptedLLM(tokenizer, reply_for), tokenizer)

    return build


async def test_each_row_is_played_on_its_own_pool_and_logged_under_it(
    servers: dict[str, EnvServer],
    mixed_loop: Callable[[PreTrainedTokenizerFast], Any],
    tokenizer: PreTrainedTokenizerFast,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = tmp_path / "episodes.jsonl"
    monkeypatch.setenv(EPISODE_LOG_ENV, str(log))
    rows = [
        row
        for pool, size in (("lake", 3), ("sudoku", 2))
        for row in build_rows(
            tasks(servers[pool]),
            split="train",
            size=size,
            seed=0,
            template_name=POOLS[pool].partition(":")[0],
            template=BUILTIN_TEMPLATES[POOLS[pool].partition(":")[0]],
            pool=pool,
        )
    ]
    assert [row["data_source"] for row in rows] == ["lake"] * 3 + ["sudoku"] * 2
    before = {pool: served(server) for pool, server in servers.items()}

    outputs = [
        await run_row(mixed_loop(tokenizer), row["item_id"], extra_info=row["extra_info"])
        for row in rows
    ]

    assert [o.extra_fields["env_pool"] for o in outputs] == ["lake"] * 3 + ["sudoku"] * 2
    assert all(o.extra_fields["env_errors"] == {} for o in outputs)
    # Each server played exactly its own pool's rows.
    assert {pool: served(s) - before[pool] for pool, s in servers.items()} == {
        "lake": 3,
        "sudoku": 2,
    }
    step = StepEpisodes()
    for line in log.read_text().splitlines():
        step.add(EpisodeRecord.model_validate_json(line))
    figures = {pool: figure.model_dump() for pool, figure in (step.pool_progress() or {}).items()}
    assert {pool: figure["episodes"] for pool, figure in figures.items()} == {
        "lake": 3,
        "sudoku": 2,
    }
    lake_rewards = [o.reward_score for o in outputs[:3]]
    assert figures["lake"]["mean_reward"] == round(sum(lake_rewards) / 3, 4)
    assert figures["sudoku"]["mean_turns"] == 2.0, "max_turns 2, and a Sudoku is never solved"


async def test_a_row_for_a_pool_the_run_does_not_play_is_left_out_naming_the_pools(
    mixed_loop: Callable[[PreTrainedTokenizerFast], Any], tokenizer: PreTrainedTokenizerFast
) -> None:
    with pytest.raises(EpisodeExcluded) as excluded:
        await run_row(mixed_loop(tokenizer), "frozen_lake_0", extra_info={"pool": "sea"})
    assert excluded.value.ending == "bad_input"
    assert "row 'frozen_lake_0' is for pool 'sea'; this run plays lake, sudoku" in str(
        excluded.value
    )
