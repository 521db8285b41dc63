"""Non-LLM policies for preflight runs: each maps the latest observation to an env action."""

from __future__ import annotations

import random
from collections import deque
from typing import Protocol

from gymkube_agentloop.templates import BRACKETED

FROZEN_LAKE_MOVES: dict[str, tuple[int, int]] = {
    "up": (-1, 0),
    "down": (1, 0),
    "left": (0, -1),
    "right": (0, 1),
}
FROZEN_LAKE_CELLS = frozenset("SFHGP")
# Actions ScienceWorld accepts in every room and every task.
SCIWORLD_SAFE_ACTIONS = ("look around", "inventory", "task", "wait1")


class Policy(Protocol):
    def act(self, observation: str) -> str: ...


class FrozenLakeShortestPath:
    """Walks the shortest hole-free path to G on the grid the observation shows."""

    def act(self, observation: str) -> str:
        grid = [
            line.split()
            for line in observation.splitlines()
            if line.split() and all(cell in FROZEN_LAKE_CELLS for cell in line.split())
        ]
        cells = {(r, c): cell for r, row in enumerate(grid) for c, cell in enumerate(row)}
        start = next((pos for pos, cell in cells.items() if cell == "P"), None)
        if start is None:
            start = next((pos for pos, cell in cells.items() if cell == "S"), (0, 0))
        first_move: dict[tuple[int, int], str] = {start: ""}
        queue = deque([start])
        while queue:
            pos = queue.popleft()
            if cells.get(pos) == "G":
                return first_move[pos]
            for move, (d_row, d_col) in FROZEN_LAKE_MOVES.items():
                nxt = (pos[0] + d_row, pos[1] + d_col)
                if nxt in cells and cells[nxt] != "H" and nxt not in first_move:
                    first_move[nxt] = first_move[pos] or move
                    queue.append(nxt)
        return "right"


class Cycle:
    """Repeats a fixed list of actions."""

    def __init__(self, actions: tuple[str, ...]) -> None:
        self._actions = actions
        self._next = 0

    def act(self, observation: str) -> str:
        action = self._actions[self._next % len(self._actions)]
        self._next += 1
        return action


class RandomChoice:
    def __init__(self, actions: tuple[str, ...], rng: random.Random) -> None:
        self._actions = actions
        self._rng = rng

    def act(self, observation: str) -> str:
        return self._rng.choice(self._actions)


def example_moves(rules: str) -> tuple[str, ...]:
    """The moves a TextArena game's rules show, in order: `[5 3 7]`, `[up]`, `[A C]`.

    Placeholders such as `[row column number]` become `[1 1 1]`, so a game that only describes
    its format (Lights Out) still gets a well-formed move. `[GAME]` is the game's speaker tag.
    """
    moves: list[str] = []
    for bracketed in BRACKETED.findall(rules):
        words = bracketed[1:-1].replace(",", " ").split()
        if bracketed == "[GAME]" or not words:
            continue
        if len(words) > 1:
            words = ["1" if word.isalpha() and len(word) > 1 else word for word in words]
        move = f"[{' '.join(words)}]"
        if move not in moves:
            moves.append(move)
    return tuple(moves)


class GameRuleMoves:
    """Plays the example moves of a TextArena game's rules (read from the first observation):
    in turn (scripted) or at random. Well-formed moves, not good ones: enough to drive episodes
    through the pool."""

    def __init__(self, rng: random.Random | None) -> None:
        self._rng = rng
        self._moves: tuple[str, ...] = ()
        self._next = 0

    def act(self, observation: str) -> str:
        if not self._moves:
            self._moves = example_moves(observation) or ("[1]",)
        if self._rng is not None:
            return self._rng.choice(self._moves)
        move = self._moves[self._next % len(self._moves)]
        self._next += 1
        return move


RANDOM_ACTIONS: dict[str, tuple[str, ...]] = {
    "frozen_lake": tuple(FROZEN_LAKE_MOVES),
    "sciworld": SCIWORLD_SAFE_ACTIONS,
}
POLICY_ENVS = ("frozen_lake", "sciworld", "textarena")


def make_policy(env: str, kind: str, rng: random.Random) -> Policy:
    """A fresh policy for one episode of `env`; ValueError when there is none for it."""
    env_kind = env.split(":", 1)[0]
    if env_kind == "textarena":
        return GameRuleMoves(rng if kind == "random" else None)
    if kind == "scripted" and env_kind == "frozen_lake":
        return FrozenLakeShortestPath()
    if kind == "scripted" and env_kind == "sciworld":
        return Cycle(SCIWORLD_SAFE_ACTIONS)
    if kind == "random" and env_kind in RANDOM_ACTIONS:
        return RandomChoice(RANDOM_ACTIONS[env_kind], rng)
    known = ", ".join(POLICY_ENVS)
    raise ValueError(f"no {kind} policy for env {env!r} (policies exist for: {known})")
