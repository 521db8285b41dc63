"""What the server needs from an env kind: a backend that starts instances, and the instances."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gymkube_envserver.wire import ScoreScale, TaskInfo, TasksResponse


class EnvInputError(ValueError):
    """The request is well-formed but names something the env does not have (answered 422)."""


class EnvLostError(RuntimeError):
    """The instance is gone (its process died); the session cannot continue (answered 410)."""


ConfigT = TypeVar("ConfigT", bound=BaseModel)


def parse_env_config(model: type[ConfigT], env_config: dict[str, Any], env: str) -> ConfigT:
    """env_config checked against an env's config model; EnvInputError lists every problem."""
    try:
        return model.model_validate(env_config)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in err['loc']) or 'env_config'}: {err['msg']}"
            for err in exc.errors()
        )
        raise EnvInputError(f"invalid {env} env_config: {problems}") from None


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

    async def warm_up(self) -> None:
        """Run before the instance joins the warm pool, so the first real reset is fast."""
        return None

    def warms_up(self) -> bool:
        """True when ``warm_up`` does work (a ScienceWorld JVM's JIT): the pool then also runs it
        on an env a session had to start cold, when that session gives it back."""
        return False

    def rss_bytes(self) -> int | None:
        """Resident memory of the instance's own process (ScienceWorld's JVM); None for envs
        that run inside the server process. Read when its session ends and at each of its
        resets, to recycle a bloated one; must be cheap and must not raise."""
        return None

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
    /create; False when it is a constructor argument (plugins), so only creates that keep the
    server's default env_config (the one warm instances start with) may take a warm one."""
    reusable: bool = True
    """True when a reset leaves nothing of the instance's earlier episodes, so an instance a
    session gave back may serve the next session; False closes it with its session."""
    replayable: bool = True
    """True when the same reset (data_idx, seed, env_config) and the same actions give the same
    observations on any instance, so a client may rebuild a lost session's episode on another
    server (``/tasks`` says so). The client compares hashes of the replayed observations with
    those it saw, so an env that is not quite deterministic fails its replay, never diverges."""

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


SEEDED_TASK_COUNT = 10_000
SEEDED_SPLITS = {"train": (0, 8_000), "dev": (8_000, 9_000), "test": (9_000, 10_000)}


def seeded_tasks(env: str, task_name: str, score_scale: ScoreScale) -> TasksResponse:
    """The task table of an env whose data_idx is simply the episode seed."""
    return TasksResponse(
        env=env,
        count=SEEDED_TASK_COUNT,
        score_scale=score_scale,
        task_names=[task_name],
        tasks=[TaskInfo(name=task_name, first_idx=0, count=SEEDED_TASK_COUNT)],
        splits={name: list(range(lo, hi)) for name, (lo, hi) in SEEDED_SPLITS.items()},
    )


def episode_seed(params: ResetParams) -> int:
    """The seed of a seeded env's episode: the reset's seed, else its data_idx, else 0."""
    if params.seed is not None:
        return params.seed
    return params.data_idx or 0


def jsonable(value: Any, depth: int = 0) -> Any:
    """``value`` made JSON-safe for an ``info`` dict (third-party envs put anything there)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if depth < 8 and isinstance(value, dict):
        return {str(key): jsonable(item, depth + 1) for key, item in value.items()}
    if depth < 8 and isinstance(value, list | tuple | set | frozenset):
        return [jsonable(item, depth + 1) for item in value]
    return str(value)
