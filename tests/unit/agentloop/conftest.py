"""Fixtures of the agent-loop tests: real env servers, a tokenizer built here (no model hub)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from agentloop_harness import (
    AGENT_YAML,
    CHAT_TEMPLATE,
    SPECIAL_TOKENS,
    EnvServer,
    register_from_yaml,
)
from gymkube_agentloop.client import close_shared_session
from gymkube_agentloop.templates import BUILTIN_TEMPLATES
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast


@pytest.fixture
def start_env_server() -> Iterator[Callable[..., EnvServer]]:
    servers: list[EnvServer] = []

    def start(env: str, *args: str, timeout_s: float = 30.0) -> EnvServer:
        server = EnvServer(env, *args)
        servers.append(server)
        server.wait_ready(timeout_s)
        return server

    yield start
    for server in servers:
        server.kill()


@pytest.fixture(scope="module")
def frozen_lake() -> Iterator[EnvServer]:
    server = EnvServer("frozen_lake")
    try:
        server.wait_ready(30)
        yield server
    finally:
        server.kill()


@pytest.fixture(autouse=True)
async def _close_http_session() -> AsyncIterator[None]:
    yield
    await close_shared_session()


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on the prompts and env texts the tests produce."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = [t.instructions + t.acknowledgement + t.system for t in BUILTIN_TEMPLATES.values()]
    corpus += [
        "You moved down. You moved up. You moved left. You moved right. You stand on the start.",
        "F F H P G S You are at row 1, column 2. Replies left: 19. Thought: Action: look around",
        "<action>down</action> <action>right</action> <action>up</action> <action>left</action>",
    ]
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(corpus * 5, trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


@pytest.fixture
def agent_yaml(tmp_path: Path) -> Callable[..., Path]:
    """Writes an agent-loop YAML for a pool URL (plus extra keys) and registers it."""

    def write(env_url: str, extra: str = "") -> Path:
        path = tmp_path / "agent.yaml"
        path.write_text(AGENT_YAML.format(env_url=env_url) + extra)
        register_from_yaml(path)
        return path

    return write
