"""A real OpenEnv server (OpenEnv 0.10's ``create_app`` under uvicorn) hosting TextArena Sudoku.

The "bring your own OpenEnv server" tests and ``bench/openenv.py`` run it as a process:

    python openenv_sudoku.py --port 8000 --max-sessions 8

The ``Environment`` is thin: it makes the TextArena calls gymkube's own TextArena env makes.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from router_harness import Proc

GAME = "Sudoku-v0"


def openenv_sudoku_server(max_sessions: int) -> Proc:
    """A harness process running this file's server."""
    from router_harness import Proc  # (not needed when this file runs as the server)

    return Proc(
        f"OpenEnv Sudoku server (max {max_sessions})",
        ["--max-sessions", str(max_sessions)],
        launcher=[__file__],
    )


def serve(argv: list[str]) -> None:
    import uvicorn
    from gymkube_envserver.envs.textarena import make_game
    from openenv.core.env_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State

    parser = argparse.ArgumentParser(prog="openenv-sudoku")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-sessions", type=int, required=True)
    args = parser.parse_args(argv)

    class SudokuAction(Action):
        message: str

    class SudokuObservation(Observation):
        prompt: str = ""

    class Sudoku(Environment[SudokuAction, SudokuObservation, State]):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self._state = State(episode_id=None, step_count=0)
            self._game: Any = None

        def reset(
            self, seed: int | None = None, episode_id: str | None = None, **_: Any
        ) -> SudokuObservation:
            self._game = make_game(GAME, {}, seed or 0)
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

    app = create_app(Sudoku, SudokuAction, SudokuObservation, max_concurrent_envs=args.max_sessions)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    serve(sys.argv[1:])
