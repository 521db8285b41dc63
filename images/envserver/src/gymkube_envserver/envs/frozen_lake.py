"""Text FrozenLake: seeded solvable maps, a text grid, ``<action>up</action>`` moves.

The map for an episode comes from ``(size, p, seed, layout)``; ``seed`` is
``env_config["seed"]``, else the reset's ``seed``, else its ``data_idx``. S and G sit on any two
cells, or with ``layout: classic`` in the top-left and bottom-right corners, as in Gymnasium's
FrozenLake. Moves are deterministic; off-grid moves stay put. Reaching G scores 1 and ends the
episode; a hole or the step limit ends it with 0. A reply that is not exactly one move is answered
with an observation saying why, and counts as a step. With ``moves: word``, a reply without a tag
may also name its move as a bare word ("Down.").
"""

from __future__ import annotations

import random
import re
from collections import deque
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gymkube_envserver.envs.base import (
    EnvBackend,
    EnvInputError,
    EnvInstance,
    ResetOutcome,
    ResetParams,
    StepOutcome,
    episode_seed,
    parse_env_config,
    seeded_tasks,
)
from gymkube_envserver.wire import ScoreScale, TasksResponse

MAP_ATTEMPTS = 10_000
MOVES: dict[str, tuple[int, int]] = {
    "up": (-1, 0),
    "down": (1, 0),
    "left": (0, -1),
    "right": (0, 1),
}
ACTION_TAG = re.compile(r"<action>(.*?)</action>", re.IGNORECASE | re.DOTALL)
MOVE_WORD = re.compile(rf"\b({'|'.join(MOVES)})\b", re.IGNORECASE)
MoveStyle = Literal["tag", "word"]
Layout = Literal["random", "classic"]
HOW_TO_REPLY: dict[MoveStyle, str] = {
    "tag": (
        "Reply with one move: <action>up</action>, <action>down</action>, "
        "<action>left</action> or <action>right</action>."
    ),
    "word": (
        "Reply with one move: up, down, left or right. A plain word is enough; "
        "<action>down</action> works too."
    ),
}
NO_MOVE: dict[MoveStyle, str] = {
    "tag": "no <action>...</action> tag found",
    "word": "no move word (up, down, left, right) or <action>...</action> tag found",
}


class FrozenLakeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    size: int = Field(default=4, ge=2, le=16, description="The lake is size x size.")
    p: float = Field(default=0.8, ge=0.3, le=1.0, description="Chance a cell is safe ice.")
    seed: int | None = Field(default=None, description="Map seed; overrides data_idx.")
    max_steps: int = Field(default=20, ge=1, le=1_000, description="Replies per episode.")
    # Small untrained models rarely write tags; "word" lets their plain answers count as moves.
    moves: MoveStyle = Field(
        default="tag",
        description="tag: only <action>move</action>; word: also a bare move word without a tag.",
    )
    # With S and G in fixed corners the right moves are always the same few: an easy curriculum.
    layout: Layout = Field(
        default="random",
        description="random: S and G on any two cells; classic: S top-left, G bottom-right.",
    )


def parse_config(env_config: dict[str, Any]) -> FrozenLakeConfig:
    return parse_env_config(FrozenLakeConfig, env_config, "frozen_lake")


def generate_map(size: int, p: float, seed: int, layout: Layout = "random") -> list[list[str]]:
    """A size x size map with one S and one G joined by a hole-free path (deterministic in seed)."""
    rng = random.Random(f"frozen_lake/{size}/{p}/{seed}")
    cells = [(row, col) for row in range(size) for col in range(size)]
    for _ in range(MAP_ATTEMPTS):
        grid = [["F" if rng.random() < p else "H" for _ in range(size)] for _ in range(size)]
        if layout == "classic":
            start, goal = cells[0], cells[-1]
        else:
            start, goal = rng.sample(cells, 2)
        grid[start[0]][start[1]] = "S"
        grid[goal[0]][goal[1]] = "G"
        if _reachable(grid, start, goal):
            return grid
    raise EnvInputError(f"no solvable {size}x{size} map with p={p}; raise p")


def _reachable(grid: list[list[str]], start: tuple[int, int], goal: tuple[int, int]) -> bool:
    size = len(grid)
    seen = {start}
    queue = deque([start])
    while queue:
        row, col = queue.popleft()
        if (row, col) == goal:
            return True
        for d_row, d_col in MOVES.values():
            nxt = (row + d_row, col + d_col)
            inside = 0 <= nxt[0] < size and 0 <= nxt[1] < size
            if inside and nxt not in seen and grid[nxt[0]][nxt[1]] != "H":
                seen.add(nxt)
                queue.append(nxt)
    return False


def parse_move(reply: str, moves: MoveStyle) -> tuple[str | None, str]:
    """The move in a reply, or None and why the reply was rejected.

    A tag always decides; with ``moves="word"`` a reply without one moves by its first whole
    move word.
    """
    tags = ACTION_TAG.findall(reply)
    if not tags:
        word = MOVE_WORD.search(reply) if moves == "word" else None
        if word is not None:
            return word.group(1).lower(), ""
        return None, NO_MOVE[moves]
    if len(tags) > 1:
        return None, f"{len(tags)} <action> tags found; send exactly one"
    move = tags[0].strip().lower()
    if move not in MOVES:
        shown = move if len(move) <= 40 else move[:40] + "..."
        return None, f"{shown!r} is not a move"
    return move, ""


class FrozenLakeInstance(EnvInstance):
    def __init__(self, env_config: dict[str, Any]) -> None:
        # A reset's env_config (the session's, with the reset's keys over it) is the whole
        # config of its episode: an instance a session gave back keeps nothing of it.
        self._config = parse_config(env_config)
        self._grid: list[list[str]] = []
        self._pos = (0, 0)
        self._steps = 0
        self._done = True

    async def reset(self, params: ResetParams) -> ResetOutcome:
        config = parse_config(params.env_config)
        seed = config.seed if config.seed is not None else episode_seed(params)
        self._config = config
        self._grid = generate_map(config.size, config.p, seed, config.layout)
        self._pos = next(
            (row, col)
            for row, line in enumerate(self._grid)
            for col, cell in enumerate(line)
            if cell == "S"
        )
        self._steps = 0
        self._done = False
        size = config.size
        task = (
            f"FrozenLake {size}x{size}: walk from S to the goal G without stepping into a hole H. "
            f"F is safe ice, P marks you. You have {config.max_steps} replies. "
            f"{HOW_TO_REPLY[config.moves]}"
        )
        return ResetOutcome(
            observation=self._view("You stand on the start."),
            reward=0.0,
            score=0.0,
            done=False,
            info=self._info(valid=True, outcome=None) | {"seed": seed},
            task_description=task,
        )

    async def step(self, action: str) -> StepOutcome:
        self._steps += 1
        moves = self._config.moves
        move, why = parse_move(action, moves)
        if move is None:
            text = f"Invalid reply: {why}. {HOW_TO_REPLY[moves]}"
            return self._outcome(text, valid=False, reached="")
        d_row, d_col = MOVES[move]
        size = len(self._grid)
        row, col = self._pos[0] + d_row, self._pos[1] + d_col
        if not (0 <= row < size and 0 <= col < size):
            return self._outcome(f"You moved {move} into the edge and stayed put.", True, "")
        self._pos = (row, col)
        cell = self._grid[row][col]
        text = f"You moved {move}."
        if cell == "H":
            return self._outcome(f"{text} You fell into a hole. Episode over.", True, "hole")
        if cell == "G":
            return self._outcome(f"{text} You reached the goal. Episode over.", True, "goal")
        return self._outcome(text, True, "")

    async def close(self) -> None:
        self._grid = []

    def _outcome(self, text: str, valid: bool, reached: str) -> StepOutcome:
        outcome = reached or None
        if outcome is None and self._steps >= self._config.max_steps:
            outcome = "step_limit"
            text += f" Step limit of {self._config.max_steps} reached. Episode over."
        self._done = outcome is not None
        reward = 1.0 if outcome == "goal" else 0.0
        return StepOutcome(
            observation=self._view(text),
            reward=reward,
            score=reward,
            done=self._done,
            info=self._info(valid=valid, outcome=outcome),
        )

    def _view(self, headline: str) -> str:
        rows = []
        for r, line in enumerate(self._grid):
            cells = [
                "P" if (r, c) == self._pos and cell != "G" else cell for c, cell in enumerate(line)
            ]
            rows.append(" ".join(cells))
        left = self._config.max_steps - self._steps
        where = f"You are at row {self._pos[0] + 1}, column {self._pos[1] + 1}."
        tail = "" if self._done else f" Replies left: {left}."
        return f"{headline}\n" + "\n".join(rows) + f"\n{where}{tail}"

    def _info(self, valid: bool, outcome: str | None) -> dict[str, Any]:
        return {
            "valid": valid,
            "outcome": outcome,
            "steps": self._steps,
            "row": self._pos[0],
            "col": self._pos[1],
        }


class FrozenLakeBackend(EnvBackend):
    name = "frozen_lake"
    canary_action = "<action>right</action>"

    def __init__(self) -> None:
        self._tasks = seeded_tasks(self.name, "frozen_lake", ScoreScale(min=0.0, max=1.0))

    def check_config(self, env_config: dict[str, Any]) -> None:
        parse_config(env_config)

    async def start(self, env_config: dict[str, Any]) -> EnvInstance:
        return FrozenLakeInstance(env_config)

    def tasks(self) -> TasksResponse:
        return self._tasks
