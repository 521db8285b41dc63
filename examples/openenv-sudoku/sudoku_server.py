"""An OpenEnv server of your own: TextArena Sudoku behind OpenEnv 0.10's ``create_app``.

This is what "bring your own OpenEnv server" means for an EnvPool (``env: openenv``): any image
that serves OpenEnv's protocol on the pool's port. It knows nothing of gymkube; the Dockerfile
beside it builds it from PyPI's ``openenv`` and ``textarena``. gymkube's tests run this file as a
process too.

    python sudoku_server.py [--host 0.0.0.0] [--port 8000] [--max-sessions 8]

``--port`` and ``--max-sessions`` default to ``PORT`` and ``MAX_CONCURRENT_ENVS`` from the
environment (an EnvPool sets ``MAX_CONCURRENT_ENVS`` to its ``sessionsPerReplica``).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import textarena as ta
import uvicorn
from openenv.core.env_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

GAME = "Sudoku-v0"


class SudokuAction(Action):
    message: str


class SudokuObservation(Observation):
    prompt: str = ""


class Sudoku(Environment[SudokuAction, SudokuObservation, State]):
    """One single-player TextArena Sudoku game per OpenEnv session."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=None, step_count=0)
        self._game: Any = None

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **_: Any
    ) -> SudokuObservation:
        self._game = ta.make(GAME)
        self._game.reset(num_players=1, seed=seed or 0)
        self._state = State(episode_id=episode_id, step_count=0)
        return SudokuObservation(prompt=str(self._game.get_observation()[1]), reward=0.0)

    def step(self, action: SudokuAction, **_: Any) -> SudokuObservation:
        done, _info = self._game.step(action.message)
        self._state.step_count += 1
        rewards = self._game.state.rewards if done else None
        reward = float(rewards.get(0, 0.0)) if rewards else 0.0
        observation = str(self._game.get_observation()[1])
        return SudokuObservation(prompt=observation, reward=reward, done=bool(done))

    @property
    def state(self) -> State:
        return self._state


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="openenv-sudoku")
    parser.add_argument("--host", default="0.0.0.0")  # a server in a pod: every interface
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    parser.add_argument(
        "--max-sessions", type=int, default=int(os.environ.get("MAX_CONCURRENT_ENVS", "8"))
    )
    args = parser.parse_args(argv)
    app = create_app(Sudoku, SudokuAction, SudokuObservation, max_concurrent_envs=args.max_sessions)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1:])
