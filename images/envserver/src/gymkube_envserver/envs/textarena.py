"""TextArena single-player games (``textarena:<GameId>``, e.g. ``textarena:Sudoku-v0``).

Each reset makes a fresh game with ``ta.make(GameId, **env_config)`` and resets it for one player
with ``seed`` (else ``data_idx``). The observation is the game's own text for player 0: the default
game ids return the whole conversation so far; the ``-train`` variants (e.g. ``Sudoku-v0-train``)
return the current board only. Reward and score are the game's final reward (-1..1; Sudoku: the
fraction of the puzzle solved, 1 when complete), 0 until the game ends. Every reset is seeded and
each game keeps its own random stream, so an episode is a function of its seed and moves: the
env is replayable.

Games that need a download (Wordle and Hangman want NLTK corpora) or more than one player are
refused at startup with a clear message.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import textarena as ta

from gymkube_envserver.envs.base import (
    EnvBackend,
    EnvInputError,
    EnvInstance,
    ResetOutcome,
    ResetParams,
    StepOutcome,
    episode_seed,
    jsonable,
    seeded_tasks,
)
from gymkube_envserver.wire import ScoreScale, TasksResponse

T = TypeVar("T")
PLAYER = 0
OFFLINE_GAMES = (
    "Sudoku-v0",
    "GuessTheNumber-v0",
    "Minesweeper-v0",
    "TowerOfHanoi-v0",
    "FifteenPuzzle-v0",
    "LightsOut-v0",
    "Mastermind-v0",
    "2048-v0",
    "Crosswords-v0",
    "FrozenLake-v0",
    "Sokoban-v0",
    "RushHour-v0",
)
"""Single-player games checked to run with no network (each also has -train and other variants)."""


class UnusableGameError(ValueError):
    """The game id cannot be served here (unknown, multi-player, or needs a download)."""


def make_game(game_id: str, env_config: dict[str, Any], seed: int) -> Any:
    """A started single-player game; EnvInputError when env_config does not fit the game."""
    try:
        game = ta.make(game_id, **env_config)
    except TypeError as exc:
        raise EnvInputError(f"invalid env_config for {game_id}: {exc}") from None
    game.reset(num_players=1, seed=seed)
    return game


_PROCESS_RANDOM = threading.Lock()
"""Held while a game draws from the process-wide ``random``, which TextArena games share."""


class TextArenaInstance(EnvInstance):
    def __init__(self, game_id: str) -> None:
        self._game_id = game_id
        self._game: Any = None
        self._random_state: Any = None

    def _with_own_random(self, call: Callable[..., T], *args: Any) -> T:
        """``call`` drawing from this game's own random stream.

        TextArena seeds the module-level ``random`` at reset and some games draw from it while
        playing (2048 spawns tiles, Minesweeper lays its mines at the first move): with sessions
        interleaved, a game would draw what another left, and a replayed episode would differ.
        """
        with _PROCESS_RANDOM:
            if self._random_state is not None:
                random.setstate(self._random_state)
            try:
                return call(*args)
            finally:
                self._random_state = random.getstate()

    async def reset(self, params: ResetParams) -> ResetOutcome:
        seed = episode_seed(params)
        # The game's reset seeds the stream it then keeps.
        self._random_state = None
        self._game = await asyncio.to_thread(
            self._with_own_random, make_game, self._game_id, params.env_config, seed
        )
        _, observation = self._game.get_observation()
        return ResetOutcome(
            observation=str(observation),
            reward=0.0,
            score=0.0,
            done=False,
            info={"seed": seed},
            task_description=f"TextArena {self._game_id} (one player).",
        )

    async def step(self, action: str) -> StepOutcome:
        game = self._game
        done, info = await asyncio.to_thread(self._with_own_random, game.step, action)
        _, observation = game.get_observation()
        rewards = game.state.rewards if done else None
        reward = float(rewards.get(PLAYER, 0.0)) if rewards else 0.0
        details = jsonable(info) if isinstance(info, dict) else {}
        if done:
            details["game_info"] = jsonable(game.state.game_info.get(PLAYER, {}))
        return StepOutcome(
            observation=str(observation), reward=reward, score=reward, done=bool(done), info=details
        )

    async def close(self) -> None:
        self._game = None


class TextArenaBackend(EnvBackend):
    canary_action = "[1 1 1]"

    def __init__(self, game_id: str) -> None:
        self.name = f"textarena:{game_id}"
        self.game_id = game_id
        try:
            make_game(game_id, {}, seed=0)
        except AssertionError as exc:
            raise UnusableGameError(f"{game_id} is not a single-player game ({exc})") from None
        except LookupError as exc:
            raise UnusableGameError(
                f"{game_id} needs data that is not installed (it downloads NLTK corpora); "
                f"games known to work offline: {', '.join(OFFLINE_GAMES)}. ({exc})"
            ) from None
        except ValueError as exc:
            raise UnusableGameError(f"unknown TextArena game {game_id!r}: {exc}") from None
        self._tasks = seeded_tasks(self.name, game_id, ScoreScale(min=-1.0, max=1.0))

    async def start(self, env_config: dict[str, Any]) -> EnvInstance:
        return TextArenaInstance(self.game_id)

    def tasks(self) -> TasksResponse:
        return self._tasks
