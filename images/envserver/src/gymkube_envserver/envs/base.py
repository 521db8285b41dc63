"""What the server needs from an env kind: a backend that starts instances, and the instances."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from gymkube_envserver.wire import TasksResponse


class EnvInputError(ValueError):
    """The request is well-formed but names something the env does not have (answered 422)."""


class EnvLostError(RuntimeError):
    """The instance is gone (its process died); the session cannot continue (answered 410)."""


@dataclass(frozen=True)
class StepOutcome:
    observation: str
    reward: float
    score: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ResetOutcome(StepOutcome):
    task_description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    """Env-specific top-level keys of the /reset response (e.g. AgentGym's task_name)."""


@dataclass(frozen=True)
class ResetParams:
    data_idx: int | None
    seed: int | None
    env_config: dict[str, Any]


class EnvInstance(ABC):
    """One started env. The server serialises calls per instance; instances may run in parallel."""

    @abstractmethod
    async def reset(self, params: ResetParams) -> ResetOutcome: ...

    @abstractmethod
    async def step(self, action: str) -> StepOutcome: ...

    @abstractmethod
    async def close(self) -> None:
        """Free everything the instance holds. Must not raise."""


class EnvBackend(ABC):
    """An env kind: starts instances and describes its tasks."""

    name: str
    canary_action: str
    """A valid action for the canary episode's step."""
    config_at_reset: bool = True
    """True when env_config takes effect at reset, so a pre-started (warm) instance can serve any
    /create; False when it is a constructor argument (plugins), so only config-less creates may
    take a warm one."""

    def check_config(self, env_config: dict[str, Any]) -> None:
        """Raise EnvInputError when env_config is not valid for this env (checked at /create)."""
        return None

    async def prepare(self) -> None:
        """Expensive one-time setup before the server reports ready (task tables, imports)."""
        return None

    @abstractmethod
    async def start(self, env_config: dict[str, Any]) -> EnvInstance: ...

    @abstractmethod
    def tasks(self) -> TasksResponse: ...

    async def shutdown(self) -> None:
        """Release backend-wide resources after every instance is closed."""
        return None

    def check_data_idx(self, data_idx: int | None) -> int:
        """The data_idx to use (0 when omitted); EnvInputError when out of range."""
        count = self.tasks().count
        index = 0 if data_idx is None else data_idx
        if not 0 <= index < count:
            raise EnvInputError(f"data_idx {index} is out of range: this env has 0..{count - 1}")
        return index
