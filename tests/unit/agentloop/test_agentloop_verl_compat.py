"""A loop written for verl 0.9.0 calls names verl 0.9.1 renamed or dropped; gymkube puts them back
(gymkube_agentloop.verl_compat) in every process that imports verl."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from agentloop_harness import ScriptedLLM, instantiate_loop
from gymkube_agentloop.templates import BUILTIN_TEMPLATES
from transformers import PreTrainedTokenizerFast

OPENING = [*BUILTIN_TEMPLATES["frozen_lake"].opening(), {"role": "user", "content": "S F"}]
REPLY = "<action>down</action>"


async def test_the_090_names_give_what_the_091_names_give(
    tokenizer: PreTrainedTokenizerFast, agent_yaml: Callable[..., Path]
) -> None:
    agent_yaml("http://127.0.0.1:9")
    loop = instantiate_loop("gymkube_env", ScriptedLLM(tokenizer, ["x"]), tokenizer)

    rendered = await loop.ct_build_initial_tokens(OPENING)
    assert await loop.apply_chat_template(OPENING) == rendered

    previous = [*OPENING, {"role": "assistant", "content": REPLY}]
    updated = [*previous, {"role": "user", "content": "H F G"}]
    runtime = rendered + tokenizer.encode(REPLY, add_special_tokens=False)
    old = await loop.ct_merge_non_assistant_msg(previous, updated, runtime, [1] * 4, [0.1] * 4)
    new = await loop.ct_merge_context_msg(previous, updated, runtime, [1] * 4, [0.1] * 4)
    assert old[0].token_ids == new[0].token_ids
    assert old[1:] == new[1:]
    assert len(old[1]) > 4
    assert set(old[1][4:]) == {0}, "the env's tokens are masked out"

    builder = loop.continuous_token_builder
    assert builder.tokenize_non_assistant_incremental_messages(
        previous, updated
    ) == builder.tokenize_context_incremental_messages(previous, updated)
    assert (
        builder.merge_non_assistant_tokens(previous, updated, runtime).token_ids
        == builder.merge_context_tokens(previous, updated, runtime).token_ids
    )


def _has_090_names(**env: str) -> str:
    """Which 0.9.0 names AgentLoopBase has in a fresh interpreter, as each of verl's workers is."""
    probe = (
        "import inspect, verl\n"
        "from verl.experimental.agent_loop.agent_loop import AgentLoopBase\n"
        "assert 'class AgentLoopBase' in inspect.getsource(AgentLoopBase)\n"
        "print(hasattr(AgentLoopBase, 'ct_merge_non_assistant_msg'),"
        " hasattr(AgentLoopBase, 'apply_chat_template'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return result.stdout.strip()


def test_every_process_that_imports_verl_has_the_090_names() -> None:
    assert _has_090_names() == "True True"
    # verl's own switch for plugins turns the aliases off: they are what a 0.9.0 loop needs.
    assert _has_090_names(VERL_USE_EXTERNAL_PLUGINS="none") == "False False"
