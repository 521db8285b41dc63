"""A real OpenEnv server as a test process: examples/openenv-sudoku/sudoku_server.py (OpenEnv
0.10's ``create_app`` under uvicorn, hosting TextArena Sudoku), as the "bring your own OpenEnv
server" tests and ``bench/openenv_ws.py`` run it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from router_harness import Proc

SERVER = Path(__file__).resolve().parents[3] / "examples" / "openenv-sudoku" / "sudoku_server.py"


def _game() -> str:
    spec = importlib.util.spec_from_file_location("sudoku_server", SERVER)
    assert spec is not None
    assert spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return str(example.GAME)


GAME = _game()


def openenv_sudoku_server(max_sessions: int) -> Proc:
    """A harness process running the example's server."""
    return Proc(
        f"OpenEnv Sudoku server (max {max_sessions})",
        ["--max-sessions", str(max_sessions)],
        launcher=[str(SERVER)],
    )
