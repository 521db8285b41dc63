"""FrozenLake over HTTP: seeded solvable maps, text grid, <action> moves, rewards, step limit."""

from __future__ import annotations

from collections import deque
from itertools import count

import httpx
import pytest
from envserver_fixtures import asgi_client, asgi_server
from gymkube_envserver.envs.frozen_lake import FrozenLakeConfig, generate_map

pytestmark = pytest.mark.unit

MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


def grid_of(observation: str) -> list[list[str]]:
    """The map rows of an observation (lines made only of single-letter cells)."""
    rows = []
    for line in observation.splitlines():
        cells = line.split(" ")
        if cells and all(cell in {"S", "F", "H", "G", "P"} for cell in cells):
            rows.append(cells)
    return rows


def shortest_path(grid: list[list[str]]) -> list[str]:
    size = len(grid)
    start = next((r, c) for r in range(size) for c in range(size) if grid[r][c] == "P")
    paths = {start: []}
    queue = deque([start])
    while queue:
        row, col = queue.popleft()
        if grid[row][col] == "G":
            return paths[(row, col)]
        for move, (d_row, d_col) in MOVES.items():
            nxt = (row + d_row, col + d_col)
            inside = 0 <= nxt[0] < size and 0 <= nxt[1] < size
            if inside and nxt not in paths and grid[nxt[0]][nxt[1]] != "H":
                paths[nxt] = [*paths[(row, col)], move]
                queue.append(nxt)
    raise AssertionError("map has no path to the goal")


def seed_with_goal_below_start(size: int) -> int:
    """The first map seed whose goal is the cell right below the start (default p)."""
    for seed in count():
        grid = generate_map(size, FrozenLakeConfig().p, seed)
        row, col = next((r, c) for r in range(size) for c in range(size) if grid[r][c] == "S")
        if row + 1 < size and grid[row + 1][col] == "G":
            return seed
    raise AssertionError("unreachable")


async def new_episode(client: httpx.AsyncClient, **reset: object) -> tuple[str, dict]:
    created = await client.post("/create", json={"env_config": reset.pop("env_config", None)})
    assert created.status_code == 200
    session = created.json()["id"]
    response = await client.post("/reset", json={"id": session, **reset})
    assert response.status_code == 200, response.text
    return session, response.json()


async def test_solving_a_map_scores_one_and_ends_the_episode() -> None:
    async with asgi_client() as client:
        for data_idx in (0, 7, 123):
            session, first = await new_episode(client, data_idx=data_idx)
            assert "<action>up</action>" in first["task_description"]
            path = shortest_path(grid_of(first["observation"]))
            for count, move in enumerate(path, start=1):
                step = await client.post(
                    "/step", json={"id": session, "action": f"Thinking... <action>{move}</action>"}
                )
                body = step.json()
                assert body["done"] is (count == len(path))
            assert body["reward"] == 1.0
            assert body["score"] == 1.0
            assert body["info"]["outcome"] == "goal"
            again = await client.post(
                "/step", json={"id": session, "action": "<action>up</action>"}
            )
            assert again.status_code == 409
            assert again.json()["error"]["code"] == "episode_finished"
            await client.post("/close", json={"id": session})


async def test_maps_are_seeded_by_data_idx_seed_or_env_config() -> None:
    async with asgi_client() as client:
        _, a = await new_episode(client, data_idx=5)
        _, b = await new_episode(client, data_idx=5)
        _, c = await new_episode(client, seed=5)
        _, d = await new_episode(client, data_idx=9, env_config={"seed": 5})
        assert a["observation"] == b["observation"] == c["observation"] == d["observation"]
        maps = set()
        for data_idx in range(8):
            _, other = await new_episode(client, data_idx=data_idx)
            maps.add(other["observation"])
        assert len(maps) > 4
        _, big = await new_episode(client, data_idx=1, env_config={"size": 7, "p": 0.7})
        grid = grid_of(big["observation"])
        assert [len(row) for row in grid] == [7] * 7
        shortest_path(grid)


async def test_invalid_replies_are_explained_and_count_toward_the_step_limit() -> None:
    async with asgi_client() as client:
        session, _ = await new_episode(client, data_idx=2, env_config={"max_steps": 3})
        replies = ["I go up", "<action>jump</action>", "<action>up</action><action>up</action>"]
        bodies = [
            (await client.post("/step", json={"id": session, "action": reply})).json()
            for reply in replies
        ]
        assert "no <action>...</action> tag" in bodies[0]["observation"]
        assert "'jump' is not a move" in bodies[1]["observation"]
        assert "2 <action> tags" in bodies[2]["observation"]
        assert [body["info"]["valid"] for body in bodies] == [False, False, False]
        assert [body["done"] for body in bodies] == [False, False, True]
        assert bodies[2]["info"]["outcome"] == "step_limit"
        assert bodies[2]["reward"] == 0.0


async def test_stepping_into_a_hole_ends_with_zero() -> None:
    async with asgi_client() as client:
        for data_idx in range(50):
            session, first = await new_episode(client, data_idx=data_idx)
            grid = grid_of(first["observation"])
            size = len(grid)
            row, col = next((r, c) for r in range(size) for c in range(size) if grid[r][c] == "P")
            hole = next(
                (
                    move
                    for move, (d_row, d_col) in MOVES.items()
                    if 0 <= row + d_row < size
                    and 0 <= col + d_col < size
                    and grid[row + d_row][col + d_col] == "H"
                ),
                None,
            )
            if hole is None:
                await client.post("/close", json={"id": session})
                continue
            step = await client.post(
                "/step", json={"id": session, "action": f"<action>{hole}</action>"}
            )
            body = step.json()
            assert body["done"] is True
            assert body["reward"] == 0.0
            assert body["info"]["outcome"] == "hole"
            assert "hole" in body["observation"]
            return
        pytest.fail("no map among 50 has a hole next to the start")


async def test_tasks_report_count_splits_and_score_scale() -> None:
    async with asgi_client() as client:
        tasks = (await client.get("/tasks")).json()
        assert tasks["env"] == "frozen_lake"
        assert tasks["count"] == 10_000
        assert tasks["score_scale"] == {"min": 0.0, "max": 1.0}
        splits = tasks["splits"]
        assert sorted(splits["train"] + splits["dev"] + splits["test"]) == list(range(10_000))
        bad = await client.post("/create", json={"env_config": {"size": 99}})
        assert bad.status_code == 422
        assert "size" in bad.json()["error"]["message"]


async def test_a_pool_default_word_map_is_won_by_a_plain_down_from_a_warm_env() -> None:
    seed = seed_with_goal_below_start(2)
    async with asgi_server(env_config={"size": 2, "moves": "word"}, warm=1) as (client, app):
        status = (await client.get("/status")).json()
        assert status["env_config"] == {"size": 2, "moves": "word"}
        ((warm_env),) = [env.instance for env in app.state.manager.warm]
        session, first = await new_episode(client, data_idx=seed)
        assert app.state.manager.sessions[session].instance is warm_env
        assert [len(row) for row in grid_of(first["observation"])] == [2, 2]
        assert "plain word" in first["task_description"]
        step = (await client.post("/step", json={"id": session, "action": "Down."})).json()
        assert (step["reward"], step["done"], step["info"]["outcome"]) == (1.0, True, "goal")


async def test_tag_moves_reject_a_bare_word() -> None:
    seed = seed_with_goal_below_start(2)
    async with asgi_client(env_config={"size": 2}) as client:
        session, first = await new_episode(client, data_idx=seed)
        assert "plain word" not in first["task_description"]
        bare = (await client.post("/step", json={"id": session, "action": "Down."})).json()
        assert "no <action>...</action> tag" in bare["observation"]
        assert (bare["info"]["valid"], bare["done"]) == (False, False)
        tagged = await client.post("/step", json={"id": session, "action": "<action>down</action>"})
        assert tagged.json()["info"]["outcome"] == "goal"


async def test_create_and_reset_env_config_override_the_pool_default_key_by_key() -> None:
    async with asgi_client(env_config={"size": 2, "max_steps": 3}) as client:
        session, first = await new_episode(client, data_idx=1, env_config={"size": 3})
        assert len(grid_of(first["observation"])) == 3
        assert "You have 3 replies" in first["task_description"]
        bigger = await client.post(
            "/reset", json={"id": session, "data_idx": 1, "env_config": {"size": 5}}
        )
        assert len(grid_of(bigger.json()["observation"])) == 5
        # A reset's env_config holds for its own episode only.
        again = await client.post("/reset", json={"id": session, "data_idx": 1})
        assert len(grid_of(again.json()["observation"])) == 3
        _, plain = await new_episode(client, data_idx=1)
        assert len(grid_of(plain["observation"])) == 2


async def test_metrics_count_ended_episodes_with_the_score_each_ended_on() -> None:
    """What a trainer's rewards are checked against: an episode ends at the session's next
    /reset or its /close (a second /close counts nothing), with the score it reached."""
    won = seed_with_goal_below_start(2)
    async with asgi_client(env_config={"size": 2}) as client:
        session, _ = await new_episode(client, data_idx=won)
        await client.post("/step", json={"id": session, "action": "<action>down</action>"})
        await client.post("/reset", json={"id": session, "data_idx": won})
        await client.post("/step", json={"id": session, "action": "<action>right</action>"})
        await client.post("/close", json={"id": session})
        await client.post("/close", json={"id": session})
        unstarted = (await client.post("/create")).json()["id"]
        await client.post("/close", json={"id": unstarted})
        text = (await client.get("/metrics")).text
    assert "gymkube_envserver_episodes_total 2.0" in text
    assert "gymkube_envserver_episode_score_total 1.0" in text


async def test_a_classic_layout_starts_top_left_and_ends_bottom_right() -> None:
    async with asgi_client() as client:
        maps = set()
        for data_idx in range(12):
            config = {"size": 3, "p": 0.7, "layout": "classic"}
            session, first = await new_episode(client, data_idx=data_idx, env_config=config)
            grid = grid_of(first["observation"])
            assert grid[0][0] == "P"
            assert grid[2][2] == "G"
            maps.add(first["observation"])
            for move in shortest_path(grid):
                action = f"<action>{move}</action>"
                body = (await client.post("/step", json={"id": session, "action": action})).json()
            assert body["info"]["outcome"] == "goal"
            await client.post("/close", json={"id": session})
        # The holes still vary with the seed.
        assert len(maps) > 4
        bad = await client.post("/create", json={"env_config": {"layout": "spiral"}})
        assert bad.status_code == 422
