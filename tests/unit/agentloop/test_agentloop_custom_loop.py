"""examples/custom-agent-loop: a user's own verl loop (its own aiohttp calls, the pool URL from
FROZEN_LAKE_ENV_BASE, verl 0.9.0 names), in the agent-loop YAML the operator renders for the
example TrainingRun, plays a real FrozenLake server and hands verl's batching what it can train."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from agentloop_harness import (
    SAMPLING,
    EnvServer,
    ScriptedLLM,
    instantiate_loop,
    register_from_yaml,
    verl_postprocess,
)
from gymkube_agentloop.templates import BUILTIN_TEMPLATES
from gymkube_operator.trainingrun import command
from gymkube_operator.trainingrun.command import Run, RunTarget
from gymkube_operator.trainingrun.models import TrainingRunSpec
from transformers import PreTrainedTokenizerFast

EXAMPLE = Path(__file__).parents[3] / "examples" / "custom-agent-loop"
# A 2x2 lake two moves down from its goal.
TASK, WINNING_REPLY = 3, "<action>down</action>"


@pytest.fixture
def example_loop(frozen_lake: EnvServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The example's code on the path and its agent-loop YAML registered, as in a trainer pod."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    run = yaml.safe_load((EXAMPLE / "trainingrun.yaml").read_text())
    spec = TrainingRunSpec.model_validate(run["spec"])
    target = RunTarget(
        run=Run("own", "rl", "uid", "t", "t", "p", "Never"),
        spec=spec,
        pool_url=frozen_lake.url,
        env="frozen_lake",
    )
    for variable in render_env(target):
        monkeypatch.setenv(variable["name"], variable["value"])
    path = tmp_path / command.AGENT_LOOP_FILE
    path.write_text(command.config_files(target)[command.AGENT_LOOP_FILE])
    register_from_yaml(path)


def render_env(target: RunTarget) -> list[dict[str, Any]]:
    from gymkube_operator.trainingrun import render

    trainer = render.training_child(target)["spec"]["template"]["spec"]["containers"][0]
    return [e for e in trainer["env"] if e["name"].endswith(("_ENV_URL", "_ENV_BASE"))]


async def play(tokenizer: PreTrainedTokenizerFast, llm: ScriptedLLM) -> Any:
    loop = instantiate_loop(command.AGENT_LOOP_NAME, llm, tokenizer)
    row = {
        "item_id": f"frozen_lake_{TASK}",
        "raw_prompt": BUILTIN_TEMPLATES["frozen_lake"].opening(),
    }
    return await loop.run(dict(SAMPLING), **row), row


async def test_the_example_loop_plays_the_pool_and_its_reward_is_the_envs(
    example_loop: None, tokenizer: PreTrainedTokenizerFast
) -> None:
    solved, row = await play(tokenizer, ScriptedLLM(tokenizer, [WINNING_REPLY]))
    # Right, into the lake's edge: the episode runs to the loop's own turn limit.
    stuck, _ = await play(tokenizer, ScriptedLLM(tokenizer, ["<action>right</action>"]))
    assert (solved.reward_score, stuck.reward_score) == (1.0, 0.0)
    assert stuck.num_turns == 2 * 4, "the example's max_turns parameter reached the loop"

    batch = await verl_postprocess([solved, stuck], [row, {**row, "index": 1}], tokenizer)
    assert batch.batch["rm_scores"][0].sum() == 1.0
    for position, output in enumerate((solved, stuck)):
        assert batch.batch["response_mask"][position].sum() == sum(output.response_mask) > 0
        assert 0 in output.response_mask, "the env's replies are masked out"
