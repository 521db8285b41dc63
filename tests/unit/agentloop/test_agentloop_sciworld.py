"""The gymkube_env loop and preflight against a real ScienceWorld server (one JVM)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from agentloop_harness import EnvServer, ScriptedLLM, cli, instantiate_loop, run_row
from transformers import PreTrainedTokenizerFast

pytestmark = pytest.mark.unit

# find-non-living-thing, variation 0: the agent starts in the hallway next to a picture.
FIND_NON_LIVING_THING = "sciworld_3236"


@pytest.fixture(scope="module")
def sciworld() -> Iterator[EnvServer]:
    server = EnvServer("sciworld", "--warm", "1", "--max-sessions", "2", "--canary-interval", "0")
    try:
        server.wait_ready(120)
        yield server
    finally:
        server.kill()


async def test_sciworld_reward_is_the_score_over_one_hundred(
    sciworld: EnvServer,
    tokenizer: PreTrainedTokenizerFast,
    agent_yaml: Callable[..., Path],
) -> None:
    agent_yaml(sciworld.url, "  max_turns: 2\n")
    llm = ScriptedLLM(
        tokenizer,
        [
            "Thought:\nA picture is not alive.\n\nAction:\nfocus on picture\n",
            "Thought:\nIt goes to the kitchen.\n\nAction:\nopen door to kitchen",
        ],
    )
    output = await run_row(instantiate_loop("gymkube_env", llm, tokenizer), FIND_NON_LIVING_THING)

    assert "find a(n) non-living thing" in tokenizer.decode(output.prompt_ids)
    assert "You focus on the picture." in tokenizer.decode(output.response_ids)
    # ScienceWorld scores 50 for the focus and 8 for opening the door, on its 0-100 scale.
    assert output.extra_fields["env_score"] == 58.0
    assert output.reward_score == pytest.approx(0.58)
    assert output.extra_fields["env_ending"] == "max_turns"
    assert output.extra_fields["env_errors"] == {}


def test_sciworld_preflight_plays_scripted_episodes(sciworld: EnvServer) -> None:
    done = cli(
        "gymkube-preflight", "--env-url", sciworld.url, "--env", "sciworld",
        "--episodes", "1", "--max-steps", "4", "--split", "dev",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True
    assert report["endings"] == {"max_turns": 1}
    assert report["latency_ms"]["step"]["p50"] > 0
