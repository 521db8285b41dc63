"""TextArena Sudoku over HTTP, offline; games that cannot run here are refused at startup."""

from __future__ import annotations

import pytest
from envserver_fixtures import asgi_client, asgi_server, settings
from gymkube_envserver.envs import EnvSpecError, load_backend

pytestmark = pytest.mark.unit


def sudoku_grid(observation: str) -> list[list[str]]:
    """The last board in an observation: rows 'R1  2  1  . | ...' as 9 cells each."""
    rows: dict[int, list[str]] = {}
    for line in observation.splitlines():
        parts = line.replace("|", " ").split()
        if parts and parts[0].startswith("R") and parts[0][1:].isdigit() and len(parts) == 10:
            rows[int(parts[0][1:])] = parts[1:]
    return [rows[number] for number in range(1, 10)]


def legal_move(grid: list[list[str]]) -> tuple[int, int, int]:
    for row in range(9):
        for col in range(9):
            if grid[row][col] != ".":
                continue
            box = [
                grid[r][c]
                for r in range(row // 3 * 3, row // 3 * 3 + 3)
                for c in range(col // 3 * 3, col // 3 * 3 + 3)
            ]
            used = set(grid[row]) | {grid[r][col] for r in range(9)} | set(box)
            for digit in "123456789":
                if digit not in used:
                    return row + 1, col + 1, int(digit)
    raise AssertionError("no legal move on the board")


async def test_sudoku_episode_over_http() -> None:
    async with asgi_client(env="textarena:Sudoku-v0-train") as client:
        tasks = (await client.get("/tasks")).json()
        assert tasks["score_scale"] == {"min": -1.0, "max": 1.0}
        session = (await client.post("/create")).json()["id"]
        reset = (await client.post("/reset", json={"id": session, "data_idx": 3})).json()
        assert reset["done"] is False
        grid = sudoku_grid(reset["observation"])
        row, col, digit = legal_move(grid)
        step = await client.post("/step", json={"id": session, "action": f"[{row} {col} {digit}]"})
        body = step.json()
        assert step.status_code == 200
        assert body["done"] is False
        assert sudoku_grid(body["observation"])[row - 1][col - 1] == str(digit)
        filled = next((r, c) for r in range(9) for c in range(9) if grid[r][c] != ".")
        overwrite = f"[{filled[0] + 1} {filled[1] + 1} 1]"
        rejected = (await client.post("/step", json={"id": session, "action": overwrite})).json()
        assert "invalid" in rejected["observation"].lower()
        again = (await client.post("/reset", json={"id": session, "data_idx": 3})).json()
        assert sudoku_grid(again["observation"]) == grid


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ("textarena:Wordle-v0", "needs data that is not installed"),
        ("textarena:TicTacToe-v0", "not a single-player game"),
        ("textarena:NoSuchGame-v0", "unknown TextArena game"),
    ],
)
def test_unusable_games_are_refused_with_a_reason(env: str, reason: str) -> None:
    with pytest.raises(EnvSpecError, match=reason):
        load_backend(settings(env=env))


async def test_a_given_back_game_env_starts_the_next_session_on_a_fresh_board() -> None:
    """The env of a closed session serves the next one; its reset makes a new game, so the board
    is the seed's own, whatever the last session played."""
    async with asgi_server(env="textarena:Sudoku-v0-train", warm=0, max_sessions=1) as (
        client,
        app,
    ):
        first = (await client.post("/create")).json()["id"]
        env = app.state.manager.sessions[first].instance
        board = (await client.post("/reset", json={"id": first, "seed": 5})).json()["observation"]
        row, col, digit = legal_move(sudoku_grid(board))
        await client.post("/step", json={"id": first, "action": f"[{row} {col} {digit}]"})
        await client.post("/close", json={"id": first})
        second = (await client.post("/create")).json()["id"]
        assert app.state.manager.sessions[second].instance is env
        again = (await client.post("/reset", json={"id": second, "seed": 5})).json()
        assert sudoku_grid(again["observation"]) == sudoku_grid(board)


async def test_interleaved_games_draw_what_a_game_alone_draws() -> None:
    """2048 spawns a random tile after each move: a replayed episode (same seed, same moves)
    sees the same tiles however other sessions' games interleave with it on the server."""
    moves = ["[up]", "[left]", "[down]", "[right]", "[up]", "[left]"]
    async with asgi_client(env="textarena:2048-v0-train") as client:

        async def opened(data_idx: int) -> tuple[str, str]:
            session = (await client.post("/create")).json()["id"]
            reset = await client.post("/reset", json={"id": session, "data_idx": data_idx})
            return session, reset.json()["observation"]

        async def step(session: str, move: str) -> str:
            reply = await client.post("/step", json={"id": session, "action": move})
            observation: str = reply.json()["observation"]
            return observation

        alone, first = await opened(5)
        played_alone = [first] + [await step(alone, move) for move in moves]
        replayed, first_again = await opened(5)
        other, _ = await opened(6)
        played_again = [first_again]
        for move in moves:
            await step(other, move)
            played_again.append(await step(replayed, move))

    assert played_again == played_alone
