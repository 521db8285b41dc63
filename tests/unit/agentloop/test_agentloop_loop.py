"""The gymkube_env loop on the real verl AgentLoopBase against a real FrozenLake env server."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from pathlib import Path

import pytest
from agentloop_harness import (
    SAMPLING,
    EnvServer,
    ScriptedLLM,
    instantiate_loop,
    run_row,
    verl_postprocess,
)
from gymkube_agentloop.agent_loop import TRUNCATION_MARK, EpisodeExcluded
from gymkube_agentloop.policies import FrozenLakeShortestPath
from gymkube_agentloop.templates import BUILTIN_TEMPLATES
from transformers import PreTrainedTokenizerFast

pytestmark = pytest.mark.unit

# Task 3's map puts the start two cells above the goal: two "down" moves win it.
WINNING_TASK, WINNING_REPLIES = "frozen_lake_3", ["<action>down</action>"] * 2


def runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """(value, start, end) of each run of equal mask values."""
    out, start = [], 0
    for value, group in itertools.groupby(mask):
        length = len(list(group))
        out.append((value, start, start + length))
        start += length
    return out


async def test_model_tokens_are_masked_in_and_env_tokens_out(
    frozen_lake: EnvServer,
    tokenizer: PreTrainedTokenizerFast,
    agent_yaml: Callable[..., Path],
) -> None:
    agent_yaml(frozen_lake.url)
    llm = ScriptedLLM(tokenizer, WINNING_REPLIES)
    output = await run_row(instantiate_loop("gymkube_env", llm, tokenizer), WINNING_TASK)

    assert output.extra_fields["env_ending"] == "done"
    assert len(output.response_ids) == len(output.response_mask) == len(output.response_logprobs)
    segments = runs(output.response_mask)
    assert [value for value, _, _ in segments] == [1, 0, 1]
    for value, start, end in segments:
        text = tokenizer.decode(output.response_ids[start:end])
        logprobs = output.response_logprobs[start:end]
        if value == 1:
            assert text == "<action>down</action><|im_end|>"
            assert logprobs == [-0.5] * (end - start)
        else:
            assert "You moved down." in text
            assert "<|im_start|>user" in text
            assert logprobs == [0.0] * (end - start)
    # The task reached the model as part of the prompt, not the response.
    assert "walk from S to the goal G" in tokenizer.decode(output.prompt_ids)


async def test_frozen_lake_reward_is_the_score_on_a_zero_to_one_scale(
    frozen_lake: EnvServer,
    tokenizer: PreTrainedTokenizerFast,
    agent_yaml: Callable[..., Path],
) -> None:
    agent_yaml(frozen_lake.url)
    policy = FrozenLakeShortestPath()

    def solve(conversation: str) -> str:
        return f"<action>{policy.act(conversation.rpartition('user')[2])}</action>"

    solver = ScriptedLLM(tokenizer, solve)
    solved = await run_row(instantiate_loop("gymkube_env", solver, tokenizer), "frozen_lake_8123")
    stuck = ScriptedLLM(tokenizer, ["<action>nowhere</action>"])
    stuck_loop = instantiate_loop("gymkube_env", stuck, tokenizer, response_length=8192)
    failed = await run_row(stuck_loop, "frozen_lake_8123")

    assert (solved.reward_score, solved.extra_fields["env_score"]) == (1.0, 1.0)
    assert solved.extra_fields["env_ending"] == "done"
    # Every reply was rejected until the env's own step limit ended the episode with score 0.
    assert failed.reward_score == 0.0
    assert failed.extra_fields["env_ending"] == "done"
    assert failed.extra_fields["env_steps"] == 20


async def test_response_is_cut_at_response_length(
    frozen_lake: EnvServer,
    tokenizer: PreTrainedTokenizerFast,
    agent_yaml: Callable[..., Path],
) -> None:
    agent_yaml(frozen_lake.url)
    rambling = (
        "Let me think about the lake for a while before I move. " * 3 + "<action>left</action>"
    )
    llm = ScriptedLLM(tokenizer, [rambling])
    loop = instantiate_loop("gymkube_env", llm, tokenizer, response_length=100)
    output = await run_row(loop, "frozen_lake_5")

    assert len(output.response_ids) == len(output.response_mask) == 100
    assert output.extra_fields["env_ending"] == "response_length"
    # Each generation was asked for no more tokens than the response had room for.
    budgets = [call["sampling_params"]["max_tokens"] for call in llm.calls]
    assert budgets[0] == 100
    assert all(b < 100 for b in budgets[1:])


async def test_observations_are_cut_to_the_token_budget(
    frozen_lake: EnvServer,
    tokenizer: PreTrainedTokenizerFast,
    agent_yaml: Callable[..., Path],
) -> None:
    agent_yaml(frozen_lake.url, "  max_observation_tokens: 4\n  max_turns: 2\n")
    llm = ScriptedLLM(tokenizer, ["<action>left</action>"])
    output = await run_row(instantiate_loop("gymkube_env", llm, tokenizer), "frozen_lake_5")

    env_text = tokenizer.decode(
        [t for t, m in zip(output.response_ids, output.response_mask, strict=True) if m == 0]
    )
    assert TRUNCATION_MARK in env_text
    assert "Replies left" not in env_text
    assert output.extra_fields["env_ending"] == "max_turns"
    assert output.extra_fields["env_steps"] == 2


async def test_a_bad_row_is_excluded_with_its_reason(
    frozen_lake: EnvServer,
    tokenizer: PreTrainedTokenizerFast,
    agent_yaml: Callable[..., Path],
) -> None:
    agent_yaml(frozen_lake.url)
    llm = ScriptedLLM(tokenizer, WINNING_REPLIES)
    with pytest.raises(EpisodeExcluded) as excluded:
        await run_row(instantiate_loop("gymkube_env", llm, tokenizer), "frozen_lake_99999")

    assert excluded.value.ending == "bad_input"
    assert "0..9999" in excluded.value.detail
    assert "frozen_lake_99999" in str(excluded.value)
    assert excluded.value.extra_fields["env_ending"] == "bad_input"
    assert llm.calls == []


async def test_trajectories_pass_through_verls_batching_with_the_reward_on_the_last_token(
    frozen_lake: EnvServer,
    tokenizer: PreTrainedTokenizerFast,
    agent_yaml: Callable[..., Path],
) -> None:
    agent_yaml(frozen_lake.url, "  max_turns: 2\n")
    opening = BUILTIN_TEMPLATES["frozen_lake"].opening()
    rows = [
        {"item_id": WINNING_TASK, "raw_prompt": opening, "index": 0},
        {"item_id": "frozen_lake_5", "raw_prompt": opening, "index": 1},
        {"item_id": "frozen_lake_99999", "raw_prompt": opening, "index": 2},
    ]
    replies = [WINNING_REPLIES, ["<action>left</action>"], WINNING_REPLIES]
    outputs = []
    for row, script in zip(rows, replies, strict=True):
        loop = instantiate_loop("gymkube_env", ScriptedLLM(tokenizer, script), tokenizer)
        with contextlib.suppress(EpisodeExcluded):
            outputs.append(await loop.run(dict(SAMPLING), **row))
    # verl is handed only the episodes it can train on: the bad row raised instead.
    assert len(outputs) == 2
    batch = await verl_postprocess(outputs, rows[:2], tokenizer)

    rm_scores = batch.batch["rm_scores"]
    won_length = len(outputs[0].response_ids)
    assert rm_scores[0, won_length - 1] == 1.0
    assert rm_scores[0].sum() == 1.0
    assert rm_scores[1].sum() == 0.0
    for position, output in enumerate(outputs):
        assert batch.batch["response_mask"][position].sum() == sum(output.response_mask) > 0
    assert list(batch.non_tensor_batch["env_ending"]) == ["done", "max_turns"]
    assert list(batch.non_tensor_batch["env_steps"]) == [2, 2]
    assert batch.meta_info["reward_extra_keys"] == [
        "env_steps",
        "env_errors",
        "env_replays",
        "env_replay_canary_failures",
        "env_replay_seconds",
    ]


@pytest.mark.parametrize("observation_chars", [100, 5000], ids=["inline", "in-thread"])
async def test_token_merges_match_verls_own_helpers(
    tokenizer: PreTrainedTokenizerFast, agent_yaml: Callable[..., Path], observation_chars: int
) -> None:
    """The loop runs verl's merges inline (long observations in a thread): same tokens, same
    mask, same log-probs as verl's AgentLoopBase helpers give."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase

    agent_yaml("http://127.0.0.1:9")
    loop = instantiate_loop("gymkube_env", ScriptedLLM(tokenizer, ["x"]), tokenizer)
    opening = [*BUILTIN_TEMPLATES["frozen_lake"].opening(), {"role": "user", "content": "S F"}]
    prompt = await loop.ct_build_initial_tokens(opening)
    reply = tokenizer.encode("<action>down</action>", add_special_tokens=False)
    logprobs = [-0.5] * len(reply)
    previous = [*opening, {"role": "assistant", "content": "<action>down</action>"}]
    updated = [*previous, {"role": "user", "content": ("H F G " * 2000)[:observation_chars]}]
    for ours, verls in (
        (
            await loop.ct_merge_assistant_token(prompt, reply, [], [], assistant_logprobs=logprobs),
            await AgentLoopBase.ct_merge_assistant_token(
                loop, prompt, reply, [], [], assistant_logprobs=logprobs
            ),
        ),
        (
            await loop.ct_merge_context_msg(previous, updated, prompt + reply, [1] * 4, [0.1] * 4),
            await AgentLoopBase.ct_merge_context_msg(
                loop, previous, updated, prompt + reply, [1] * 4, [0.1] * 4
            ),
        ),
    ):
        assert ours[0].token_ids == verls[0].token_ids
        assert ours[1:] == verls[1:]
