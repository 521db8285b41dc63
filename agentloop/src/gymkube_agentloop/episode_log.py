"""The episode log: one JSON line per episode the agent loop ended, trained or excluded.

`gymkube-train` names the file in `GYMKUBE_EPISODE_LOG` (verl's Ray workers inherit it) and turns
the lines into each step's episode figures: how many episodes were played, replayed after a lost
session, or excluded from training. Outside `gymkube-train` nothing is written.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

EPISODE_LOG_ENV = "GYMKUBE_EPISODE_LOG"


class EpisodeRecord(BaseModel):
    """One ended episode."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    step: int = Field(description="verl's global step the episode was generated for")
    validation: bool = Field(description="a validation episode (not part of a training step)")
    ending: str
    excluded: bool = Field(description="left out of training: its env failed, or no turn")
    replays: int = Field(default=0, ge=0, description="times its session was rebuilt")
    canary_failures: int = Field(default=0, ge=0, description="replays whose canary differed")
    pool: str | None = Field(default=None, description="the pool that served it (its row's)")
    reward: float | None = Field(default=None, description="its reward; unset when excluded")
    turns: int = Field(default=0, ge=0, description="the model's replies")
    env_errors: int = Field(default=0, ge=0, description="env calls that failed")

    def line(self) -> str:
        return self.model_dump_json(by_alias=True) + "\n"


def append_record(record: EpisodeRecord) -> None:
    """Add a record to the episode log, if one is named; one short O_APPEND write, so the lines
    of every worker process stay whole."""
    path = os.environ.get(EPISODE_LOG_ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as log:
        log.write(record.line())
