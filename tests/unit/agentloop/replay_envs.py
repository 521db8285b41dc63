"""Plugin envs of the replay tests, served as ``plugin:replay_envs:<Class>`` (this folder on
``PYTHONPATH``). Their resets are alike everywhere; their answers name the server process."""

from __future__ import annotations

import os
from typing import Any


class ProcessBoundEnv:
    """Replayable by declaration, yet its answers differ from one server to another."""

    canary_action = "<action>hello</action>"

    def __init__(self, env_config: dict[str, Any]) -> None:
        self.env_config = env_config

    async def reset(self, request: Any) -> tuple[str, dict[str, Any], str]:
        return "Say something.", {}, "Talk to the server."

    async def step(self, messages: list[dict[str, Any]]) -> tuple[str, float, bool, dict[str, Any]]:
        return f"Heard by process {os.getpid()}.", 0.0, False, {}

    async def close(self) -> None:
        return None


class UnreplayableEnv(ProcessBoundEnv):
    """The same env, saying what it is: its episodes are not a function of reset and actions."""

    replayable = False
