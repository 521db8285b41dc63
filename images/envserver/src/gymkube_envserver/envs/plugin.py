"""Plugin envs (``plugin:<module>:<Class>``) with ms-swift's gym ``Env`` shape.

The class is built as ``Class(env_config)`` per session and must provide
``async reset(request) -> (observation, info, system_message)``,
``async step(messages) -> (observation, reward, done, info)`` and ``async close()``.
``request`` carries ms-swift's ``RolloutInferRequest`` fields; its ``data_dict`` holds
``data_idx``, ``seed`` and ``env_config``. The server keeps each session's message history
(system, user observation, assistant action, ...) and passes it to ``step``. The score is the
sum of the episode's rewards, as ms-swift's ``total_reward``.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from gymkube_envserver.envs.base import (
    EnvBackend,
    EnvInstance,
    ResetOutcome,
    ResetParams,
    StepOutcome,
    jsonable,
    seeded_tasks,
)
from gymkube_envserver.wire import ScoreScale, TasksResponse

REQUIRED_COROUTINES = ("reset", "step", "close")


class PluginEnv(Protocol):
    async def reset(self, request: Any) -> tuple[str, dict[str, Any], str]: ...

    async def step(self, messages: list[dict[str, Any]]) -> tuple[str, float, bool, Any]: ...

    async def close(self) -> None: ...


class UnusablePluginError(ValueError):
    """The plugin spec does not name an importable class of the right shape."""


@dataclass
class PluginResetRequest:
    """The attributes of ms-swift's ``RolloutInferRequest`` that an env's reset may read."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    audios: list[str] = field(default_factory=list)
    videos: list[str] = field(default_factory=list)
    tools: list[Any] | None = None
    objects: dict[str, Any] = field(default_factory=dict)
    data_dict: dict[str, Any] = field(default_factory=dict)
    uuid: str | None = None


def load_plugin_class(module_name: str, class_name: str) -> type:
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnusablePluginError(f"cannot import plugin module {module_name!r}: {exc}") from None
    cls = getattr(module, class_name, None)
    if not inspect.isclass(cls):
        raise UnusablePluginError(f"{module_name} has no class {class_name!r}")
    missing = [
        name
        for name in REQUIRED_COROUTINES
        if not inspect.iscoroutinefunction(getattr(cls, name, None))
    ]
    if missing:
        raise UnusablePluginError(
            f"{module_name}.{class_name} lacks async {', '.join(missing)} (ms-swift Env shape)"
        )
    return cls


class PluginInstance(EnvInstance):
    def __init__(self, env: PluginEnv) -> None:
        self._env = env
        self._messages: list[dict[str, Any]] = []
        self._score = 0.0

    async def reset(self, params: ResetParams) -> ResetOutcome:
        request = PluginResetRequest(
            data_dict={
                "data_idx": params.data_idx,
                "seed": params.seed,
                "env_config": params.env_config,
            }
        )
        observation, info, system_message = await self._env.reset(request)
        system = [{"role": "system", "content": str(system_message)}] if system_message else []
        self._messages = [*system, {"role": "user", "content": str(observation)}]
        self._score = 0.0
        return ResetOutcome(
            observation=str(observation),
            reward=0.0,
            score=0.0,
            done=False,
            info=jsonable(info) if isinstance(info, dict) else {},
            task_description=str(system_message or ""),
            extra={"system_message": str(system_message or "")},
        )

    async def step(self, action: str) -> StepOutcome:
        self._messages.append({"role": "assistant", "content": action})
        observation, reward, done, info = await self._env.step(list(self._messages))
        self._messages.append({"role": "user", "content": str(observation)})
        self._score += float(reward)
        return StepOutcome(
            observation=str(observation),
            reward=float(reward),
            score=self._score,
            done=bool(done),
            info=jsonable(info) if isinstance(info, dict) else {},
        )

    async def close(self) -> None:
        await self._env.close()


class PluginBackend(EnvBackend):
    canary_action = ""
    config_at_reset = False

    def __init__(self, module_name: str, class_name: str) -> None:
        self.name = f"plugin:{module_name}:{class_name}"
        self.plugin_class = load_plugin_class(module_name, class_name)
        # Plugins say what their scores mean with optional class attributes.
        scale = getattr(self.plugin_class, "score_scale", (0.0, 1.0))
        self.canary_action = str(getattr(self.plugin_class, "canary_action", ""))
        # A plugin whose reset does not start from a clean slate says so with reusable = False.
        self.reusable = bool(getattr(self.plugin_class, "reusable", True))
        # One whose episodes are not a function of reset and actions says replayable = False;
        # by default a lost episode is replayed, and the client's canary catches a divergence.
        self.replayable = bool(getattr(self.plugin_class, "replayable", True))
        self._tasks = seeded_tasks(
            self.name, class_name, ScoreScale(min=float(scale[0]), max=float(scale[1]))
        )

    async def start(self, env_config: dict[str, Any]) -> EnvInstance:
        return PluginInstance(cast(PluginEnv, self.plugin_class(env_config)))

    def tasks(self) -> TasksResponse:
        return self._tasks
