"""Fixtures of the agent-loop tests: real env servers, a tokenizer built here (no model hub)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from agentloop_harness import AGENT_YAML, EnvServer, build_tokenizer, register_from_yaml
from gymkube_agentloop.client import close_shared_session
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
    return build_tokenizer()


@pytest.fixture
def agent_yaml(tmp_path: Path) -> Callable[..., Path]:
    """Writes an agent-loop YAML for a pool URL (plus extra keys) and registers it."""

    def write(env_url: str, extra: str = "") -> Path:
        path = tmp_path / "agent.yaml"
        path.write_text(AGENT_YAML.format(env_url=env_url) + extra)
        register_from_yaml(path)
        return path

    return write
