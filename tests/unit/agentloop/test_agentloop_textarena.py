"""TextArena pools: the built-in `textarena` template through the real loop, and preflight
policies that play the moves each game's own rules show, against a real TextArena server."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from agentloop_harness import EnvServer, ScriptedLLM, cli, instantiate_loop, run_row
from gymkube_agentloop.agent_loop import TRUNCATION_MARK_START
from gymkube_agentloop.policies import GameRuleMoves, example_moves, make_policy
from gymkube_agentloop.templates import BUILTIN_TEMPLATES
from transformers import PreTrainedTokenizerFast

pytestmark = pytest.mark.unit

GAME = "textarena:Sudoku-v0"
TEXTARENA = BUILTIN_TEMPLATES["textarena"]
# How TextArena games state their move format (excerpts of Sudoku's and Lights Out's rules).
SUDOKU_RULES = (
    "[GAME] You are Player 0. Make your move in the format '[row column number]', "
    "e.g. '[5 3 7]' or [1 3 5]. Reply with [5 3 7] again? [GAME] Game Board:"
)
LIGHTS_OUT_RULES = "[GAME] Toggle a light by entering '[row col]'."


@pytest.fixture(scope="module")
def sudoku() -> Iterator[EnvServer]:
    server = EnvServer(GAME)
    try:
        server.wait_ready(60)
        yield server
    finally:
        server.kill()


@pytest.mark.parametrize(
    ("reply", "action"),
    [
        ("Row 1 has a gap at column 3, so:\n[1 3 5]", "[1 3 5]"),
        ("Not [1 1 1] (pre-filled) but [2 3 4].", "[2 3 4]"),
        ("I give up", "I give up"),
    ],
)
def test_bracket_replies_send_the_last_bracketed_move(reply: str, action: str) -> None:
    assert TEXTARENA.parse_action(reply) == action


def test_policies_play_the_moves_a_game_shows_and_fill_in_placeholders() -> None:
    assert example_moves(SUDOKU_RULES) == ("[1 1 1]", "[5 3 7]", "[1 3 5]")
    assert example_moves(LIGHTS_OUT_RULES) == ("[1 1]",)
    scripted = make_policy(GAME, "scripted", rng=None)  # type: ignore[arg-type]
    assert isinstance(scripted, GameRuleMoves)
    # The rules are read once, from the first observation; later ones show only the board.
    played = [scripted.act(SUDOKU_RULES)] + [scripted.act("R1 2 1 5 | 4 3 8") for _ in range(3)]
    assert played == ["[1 1 1]", "[5 3 7]", "[1 3 5]", "[1 1 1]"]


async def test_the_loop_plays_a_textarena_game_with_the_builtin_template(
    sudoku: EnvServer,
    tokenizer: PreTrainedTokenizerFast,
    agent_yaml: Callable[..., Path],
) -> None:
    agent_yaml(sudoku.url)
    llm = ScriptedLLM(tokenizer, ["The top-left cell is given, so I try it anyway:\n[1 1 1]"])
    loop = instantiate_loop("gymkube_env", llm, tokenizer, response_length=8192)
    output = await run_row(loop, f"{GAME}_3")

    assert output.extra_fields["env_errors"] == {}
    assert output.extra_fields["env_ending"] in {"done", "max_turns", "response_length"}
    assert output.extra_fields["env_steps"] >= 1
    assert "Sudoku" in tokenizer.decode(output.prompt_ids)
    env_text = tokenizer.decode(
        [t for t, m in zip(output.response_ids, output.response_mask, strict=True) if m == 0]
    )
    # The game repeats its whole history, over the token budget: its newest text is what stays.
    assert TRUNCATION_MARK_START in env_text
    # Only the bracketed move reached the game, and the game answered it.
    assert "[Player] [1 1 1]" in env_text
    assert "pre-filled cell (1, 1)" in env_text
    assert 0.0 <= output.reward_score <= 1.0


@pytest.mark.parametrize("policy", ["scripted", "random"])
def test_preflight_plays_whole_textarena_episodes(sudoku: EnvServer, policy: str) -> None:
    done = cli(
        "gymkube-preflight",
        "--env-url",
        sudoku.url,
        "--env",
        GAME,
        "--episodes",
        "3",
        "--policy",
        policy,
        "--max-steps",
        "6",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True
    assert report["episodes"] == 3
    assert report["env_errors"] == {}
    assert sum(report["endings"].values()) == 3
    assert report["mean_steps"] > 0
