"""ms-swift plugin: a gymkube pool as an ms-swift gym ``Env`` (``GYMScheduler``).

Load it with ``--external_plugins`` (this file's path) and point dataset rows at the pool::

    PLUGIN=$(python -c 'import gymkube_agentloop.swift_env as m; print(m.__file__)')
    swift rlhf ... --multi_turn_scheduler gym_scheduler --use_gym_env true \\
        --external_plugins "$PLUGIN"

    {"messages": [{"role": "user", "content": "<placeholder>"}],
     "env_config": {"name": "gymkube", "base_url": "http://sciworld.default.svc:8000",
                    "data_idx": 7}}

Each trajectory is one pool session over gymkube's HTTP protocol: ``reset`` creates and resets
it, ``step`` sends the model's last reply as the action, ``close`` closes it. A session lost
mid-trajectory is replayed on another server (``gymkube_agentloop.replay``). Rewards are the env's
own per-step rewards, so ms-swift's ``total_reward`` is the episode's score.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from swift.rollout.gym_env import Env, envs

from gymkube_agentloop.client import EnvClient
from gymkube_agentloop.replay import ReplayedSession

ENV_NAME = "gymkube"
"""The ``env_config.name`` (or ``--gym_env``) that selects this plugin."""


class GymkubeEnvConfig(BaseModel):
    """A dataset row's ``env_config`` for a gymkube pool."""

    model_config = ConfigDict(extra="forbid")

    name: str = ENV_NAME
    base_url: str = Field(description="The pool URL (the EnvPool's status.url).")
    data_idx: int = Field(default=0, ge=0, description="Which task (see the pool's /tasks).")
    seed: int | None = None
    env_config: dict[str, Any] = Field(
        default_factory=dict, description="Env-specific settings of the session (/create)."
    )
    system_message: str | None = Field(
        default=None, description="System prompt; the env's task description when omitted."
    )


class GymkubeEnv(Env):  # type: ignore[misc]  # ms-swift ships no type information
    """One pool session per trajectory."""

    def __init__(self, env_config: dict[str, Any]) -> None:
        super().__init__(env_config)
        try:
            self.config = GymkubeEnvConfig.model_validate(env_config)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in err['loc']) or 'env_config'}: {err['msg']}"
                for err in exc.errors()
            )
            raise ValueError(f"invalid gymkube env_config: {problems}") from None
        self.client = EnvClient(self.config.base_url)
        self.session: ReplayedSession | None = None

    async def reset(self, config: Any) -> tuple[str, dict[str, Any], str]:
        """Open a session and start its episode: (observation, info, system message)."""
        await self.close()
        self.session = ReplayedSession(
            self.client, self.config.data_idx, self.config.seed, self.config.env_config or None
        )
        reply = await self.session.start()
        system = self.config.system_message
        if system is None:
            system, observation = reply.task_description, reply.observation
        else:
            observation = f"{reply.task_description}\n{reply.observation}".strip()
        info = {"session": self.session.session_id, "data_idx": self.config.data_idx}
        return observation, info, system

    async def step(self, action: list[dict[str, Any]]) -> tuple[str, float, bool, dict[str, Any]]:
        """Play the model's last reply: (next observation, reward, done, info)."""
        if self.session is None:
            raise RuntimeError("step before reset")
        reply = await self.session.step(str(action[-1]["content"]))
        info = {"score": reply.score, "replays": self.session.stats.replays}
        return reply.observation, reply.reward, reply.done, info

    async def close(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            await session.close()


envs[ENV_NAME] = GymkubeEnv
