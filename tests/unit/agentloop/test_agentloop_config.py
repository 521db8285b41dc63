"""The gymkube_env loop as configured from an agent-loop YAML, the way verl's workers build it."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from agentloop_harness import EnvServer, ScriptedLLM, instantiate_loop
from gymkube_agentloop.settings import RewardMode
from hydra.errors import InstantiationException
from transformers import PreTrainedTokenizerFast

pytestmark = pytest.mark.unit

TERSE_TEMPLATE = """\
  prompt_template: frozen_lake
  max_turns: 3
  reward: best
  env_client:
    lost_after_s: 0.5
  templates:
    terse_lake:
      system: You walk on ice.
      instructions: Answer with <move>direction</move>.
      acknowledgement: Fine.
      action_format: tag
      action_tag: move
      example_reply: <move>{action}</move>
"""


async def test_yaml_keys_reach_the_loop(
    frozen_lake: EnvServer,
    tokenizer: PreTrainedTokenizerFast,
    agent_yaml: Callable[..., Path],
) -> None:
    agent_yaml(frozen_lake.url, TERSE_TEMPLATE)
    llm = ScriptedLLM(tokenizer, ["<move>down</move>"])
    loop = instantiate_loop("gymkube_env", llm, tokenizer)

    assert loop.settings.env_url == frozen_lake.url
    assert loop.max_turns == 3
    assert loop.settings.reward is RewardMode.BEST
    assert loop.settings.env_client.lost_after_s == 0.5
    # No raw_prompt: the row's template supplies the opening, and its parser reads <move> tags
    # (the env wants <action> tags, so it answers with an invalid-reply observation).
    output = await loop.run({}, item_id="frozen_lake_3", extra_info={"template": "terse_lake"})
    assert "Answer with <move>direction</move>." in tokenizer.decode(output.prompt_ids)
    assert output.extra_fields["env_steps"] == 3
    assert output.extra_fields["env_ending"] == "max_turns"


def test_env_url_falls_back_to_gymkube_env_url_then_sciworld_env_base(
    tokenizer: PreTrainedTokenizerFast,
    agent_yaml: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent_yaml("null")
    llm = ScriptedLLM(tokenizer, [""])
    monkeypatch.setenv("SCIWORLD_ENV_BASE", "http://sciworld-legacy:36001")
    assert instantiate_loop("gymkube_env", llm, tokenizer).settings.env_url == (
        "http://sciworld-legacy:36001"
    )
    monkeypatch.setenv("GYMKUBE_ENV_URL", "http://pool.envs:8000/")
    assert instantiate_loop("gymkube_env", llm, tokenizer).settings.env_url == (
        "http://pool.envs:8000"
    )


def test_misconfiguration_fails_loudly_at_construction(
    tokenizer: PreTrainedTokenizerFast,
    agent_yaml: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GYMKUBE_ENV_URL", raising=False)
    monkeypatch.delenv("SCIWORLD_ENV_BASE", raising=False)
    llm = ScriptedLLM(tokenizer, [""])
    agent_yaml("null")
    with pytest.raises(InstantiationException, match="env_url: Field required"):
        instantiate_loop("gymkube_env", llm, tokenizer)
    agent_yaml("http://pool:8000", "  max_turn: 5\n")
    with pytest.raises(InstantiationException, match="max_turn: Extra inputs are not permitted"):
        instantiate_loop("gymkube_env", llm, tokenizer)


def test_the_yaml_entry_survives_the_first_import_of_the_loop(
    tokenizer: PreTrainedTokenizerFast,
    agent_yaml: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A verl worker loads the YAML first and imports the loop's module only for the first
    # trajectory; every later trajectory must still get the YAML's settings.
    monkeypatch.delenv("GYMKUBE_ENV_URL", raising=False)
    monkeypatch.delenv("SCIWORLD_ENV_BASE", raising=False)
    monkeypatch.delitem(sys.modules, "gymkube_agentloop.agent_loop")
    agent_yaml("http://pool.envs:8000")
    llm = ScriptedLLM(tokenizer, [""])
    for _ in range(2):
        loop = instantiate_loop("gymkube_env", llm, tokenizer)
        assert loop.settings.env_url == "http://pool.envs:8000"
