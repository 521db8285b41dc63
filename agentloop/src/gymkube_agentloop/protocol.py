"""Messages of the gymkube env wire protocol, as this client reads them.

The models accept extra keys so that richer servers (AgentGym adds `task_name`, `var_num`, ...)
pass through, and they only require what the agent loop actually uses.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


def validation_problems(exc: ValidationError, whole: str = "value") -> str:
    """pydantic's problems as one line, `where: what; ...` (`whole` names an error at the top)."""
    return "; ".join(
        f"{'.'.join(str(part) for part in err['loc']) or whole}: {err['msg']}"
        for err in exc.errors()
    )


class _Reply(BaseModel):
    model_config = ConfigDict(extra="allow")


class CreateReply(_Reply):
    # AgentGym servers hand out integer ids; gymkube servers opaque strings.
    id: str | int


class StepReply(_Reply):
    observation: str = ""
    reward: float = 0.0
    score: float = 0.0
    done: bool = False


class ResetReply(StepReply):
    task_description: str = ""


class ErrorDetail(BaseModel):
    code: str = "error"
    message: str = ""


class ErrorReply(BaseModel):
    error: ErrorDetail


class ScoreScale(BaseModel):
    min: float = 0.0
    max: float = 1.0

    @model_validator(mode="after")
    def _max_above_min(self) -> ScoreScale:
        if self.max <= self.min:
            raise ValueError(f"score scale max ({self.max}) must exceed min ({self.min})")
        return self

    def normalise(self, score: float) -> float:
        """Where a score sits on the env's scale, 0..1; scores outside it are clipped
        (ScienceWorld scores a failed episode -100 on its 0..100 scale)."""
        return min(max((score - self.min) / (self.max - self.min), 0.0), 1.0)


class TaskRange(BaseModel):
    name: str
    first_idx: int
    count: int


class TasksReply(_Reply):
    """What `GET /tasks` says about the env a pool serves."""

    env: str
    count: int = Field(ge=0)
    score_scale: ScoreScale
    task_names: list[str] = []
    tasks: list[TaskRange] = []
    # split name -> the data_idx values in it
    splits: dict[str, list[int]] = {}
    # Whether a lost session's episode may be rebuilt elsewhere; servers that do not say are not.
    replayable: bool = False

    def indices(self, split: str) -> list[int]:
        """The data_idx values of a split."""
        if split in self.splits:
            return list(self.splits[split])
        if not self.splits:
            raise ValueError(f"env {self.env!r} publishes no splits")
        known = ", ".join(sorted(self.splits))
        raise ValueError(f"env {self.env!r} has no split {split!r} (it has: {known})")

    def task_name(self, data_idx: int) -> str:
        for task in self.tasks:
            if task.first_idx <= data_idx < task.first_idx + task.count:
                return task.name
        return ""
