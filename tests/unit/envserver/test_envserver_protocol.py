"""The wire contract on a real server (FrozenLake): errors, capacity, draining, expiry, status."""

from __future__ import annotations

import asyncio

import pytest
from envserver_fixtures import (
    asgi_client,
    asgi_server,
    record_env_starts,
    settings,
    wait_ready,
)
from gymkube_envserver.app import create_app
from gymkube_envserver.envs.base import EnvInstance

pytestmark = pytest.mark.unit

STEP = "<action>down</action>"


def error_code(response: object) -> str:
    body = response.json()  # type: ignore[attr-defined]
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message"}
    return str(body["error"]["code"])


async def test_bad_input_gets_a_4xx_json_error_never_a_traceback() -> None:
    async with asgi_client() as client:
        session = (await client.post("/create")).json()["id"]
        cases = [
            ("unknown id", "/step", {"id": "nope", "action": STEP}, 404, "session_not_found"),
            (
                "step before reset",
                "/step",
                {"id": session, "action": STEP},
                409,
                "episode_not_started",
            ),
            ("wrong type", "/reset", {"id": session, "data_idx": "first"}, 422, "bad_request"),
            ("missing field", "/step", {"id": session}, 422, "bad_request"),
            ("id of wrong type", "/step", {"id": 7, "action": STEP}, 422, "bad_request"),
            ("data_idx too big", "/reset", {"id": session, "data_idx": 10_000}, 422, "bad_request"),
            ("negative data_idx", "/reset", {"id": session, "data_idx": -1}, 422, "bad_request"),
            (
                "bad env_config",
                "/reset",
                {"id": session, "env_config": {"size": "big"}},
                422,
                "bad_request",
            ),
            (
                "1 MB action",
                "/step",
                {"id": session, "action": "x" * 1_000_000},
                422,
                "bad_request",
            ),
        ]
        for label, path, body, status, code in cases:
            response = await client.post(path, json=body)
            assert response.status_code == status, label
            assert error_code(response) == code, label
            assert len(response.content) < 2_000, f"{label}: error echoes the input"
        malformed = await client.post(
            "/step", content=b'{"id": "x", "action": ', headers={"content-type": "application/json"}
        )
        assert malformed.status_code == 422
        assert error_code(malformed) == "bad_request"
        not_json = await client.post(
            "/reset", content=b"\xff\xfe", headers={"content-type": "text/plain"}
        )
        assert not_json.status_code == 422
        huge = await client.post("/step", content=b"x" * (3 * 1024 * 1024))
        assert huge.status_code == 413
        assert error_code(huge) == "payload_too_large"
        assert (await client.get("/observation")).status_code == 422
        assert error_code(await client.get("/nowhere")) == "not_found"
        assert error_code(await client.delete("/step")) == "method_not_allowed"


async def test_close_is_idempotent_and_closed_ids_say_so() -> None:
    async with asgi_client() as client:
        session = (await client.post("/create")).json()["id"]
        await client.post("/reset", json={"id": session, "data_idx": 1})
        first = await client.post("/close", json={"id": session})
        second = await client.post("/close", json={"id": session})
        never = await client.post("/close", json={"id": "never-issued"})
        assert first.status_code == second.status_code == never.status_code == 200
        assert first.json()["was_open"] is True
        assert second.json()["was_open"] is False
        for response in (
            await client.post("/step", json={"id": session, "action": STEP}),
            await client.get("/observation", params={"id": session}),
            await client.get("/detail", params={"id": session}),
        ):
            assert response.status_code == 404
            assert "closed" in response.json()["error"]["message"]


async def test_full_server_answers_503_with_retry_after_until_a_session_closes() -> None:
    async with asgi_client(max_sessions=2, warm=1, retry_after=3) as client:
        first = (await client.post("/create")).json()["id"]
        await client.post("/create")
        full = await client.post("/create")
        assert full.status_code == 503
        assert full.headers["retry-after"] == "3"
        assert error_code(full) == "at_capacity"
        status = (await client.get("/status")).json()
        assert (status["active"], status["capacity"]) == (2, 2)
        await client.post("/close", json={"id": first})
        assert (await client.post("/create")).status_code == 200


async def test_draining_refuses_new_sessions_but_serves_open_ones() -> None:
    async with asgi_client() as client:
        session = (await client.post("/create")).json()["id"]
        await client.post("/reset", json={"id": session, "data_idx": 3})
        assert (await client.get("/readyz")).status_code == 200
        drained = await client.post("/admin/drain")
        assert drained.json() == {"draining": True, "active": 1}
        refused = await client.post("/create")
        assert refused.status_code == 503
        assert "retry-after" in refused.headers
        assert error_code(refused) == "draining"
        not_ready = await client.get("/readyz")
        assert not_ready.status_code == 503
        assert error_code(not_ready) == "not_ready"
        assert (await client.get("/status")).json()["draining"] is True
        assert (await client.post("/step", json={"id": session, "action": STEP})).status_code == 200
        await client.post("/admin/drain", json={"draining": False})
        assert (await client.get("/readyz")).status_code == 200
        assert (await client.post("/create")).status_code == 200


async def test_idle_sessions_expire_and_free_their_slot() -> None:
    async with asgi_client(idle_timeout=0.3, max_sessions=1) as client:
        session = (await client.post("/create")).json()["id"]
        await client.post("/reset", json={"id": session, "data_idx": 0})
        await asyncio.sleep(1.0)
        step = await client.post("/step", json={"id": session, "action": STEP})
        assert step.status_code == 404
        assert "expired" in step.json()["error"]["message"]
        assert (await client.get("/status")).json()["active"] == 0
        assert (await client.post("/create")).status_code == 200


async def test_status_detail_observation_and_canary() -> None:
    async with asgi_client(warm=2, canary_interval=0.2) as client:
        session = (await client.post("/create")).json()["id"]
        reset = (await client.post("/reset", json={"id": session, "data_idx": 4})).json()
        step = (await client.post("/step", json={"id": session, "action": STEP})).json()
        observation = await client.get("/observation", params={"id": session})
        assert observation.json() == step["observation"]
        detail = (await client.get("/detail", params={"id": session})).json()
        assert detail["data_idx"] == 4
        assert detail["steps"] == 1
        assert detail["task_description"] == reset["task_description"]
        for _ in range(50):
            status = (await client.get("/status")).json()
            if status["canary"]["ok"] is not None:
                break
            await asyncio.sleep(0.1)
        assert status["canary"]["ok"] is True
        assert status["canary"]["latency_ms"] > 0
        assert status["canary"]["error"] is None
        assert status["env"] == "frozen_lake"
        assert status["served"] == 1
        assert status["active"] == 1
        assert status["warm_target"] == 2
        assert status["ready"] is True
        assert (await client.get("/healthz")).json() == {"status": "ok"}


async def test_metrics_count_requests_by_endpoint_and_error_code() -> None:
    async with asgi_client() as client:
        session = (await client.post("/create")).json()["id"]
        await client.post("/step", json={"id": session, "action": STEP})
        await client.post("/step", json={"id": "missing", "action": STEP})
        text = (await client.get("/metrics")).text
        assert 'gymkube_envserver_requests_total{code="ok",endpoint="/create"} 1.0' in text
        assert (
            'gymkube_envserver_requests_total{code="episode_not_started",endpoint="/step"} 1.0'
            in text
        )
        assert (
            'gymkube_envserver_requests_total{code="session_not_found",endpoint="/step"} 1.0'
            in text
        )
        assert 'gymkube_envserver_request_duration_seconds_bucket{endpoint="/step"' in text
        assert "gymkube_envserver_active_sessions 1.0" in text
        assert "gymkube_envserver_sessions_served_total 1.0" in text


async def test_an_env_the_canary_borrows_counts_toward_the_warm_pool() -> None:
    """A refill while the canary holds a warm env starts only what is missing, and the
    borrowed env goes back: no env is started (and for ScienceWorld warmed up) to be thrown away.
    (Reuse off, so that the session's env is closed and the refill has something to start.)"""
    async with asgi_server(warm=2, reuse=False) as (client, app):
        manager = app.state.manager
        started = record_env_starts(manager.backend)
        async with manager.borrowed_spare() as borrowed:
            session = (await client.post("/create")).json()["id"]  # the other warm env
            await client.post("/reset", json={"id": session, "data_idx": 0})
            await client.post("/close", json={"id": session})
            for _ in range(100):
                if manager.warm:
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.1)
            assert len(manager.warm) == 1  # 2 wanted, 1 lent
        assert len(started) == 1
        assert len(manager.warm) == 2
        assert borrowed in [env.instance for env in manager.warm]


async def test_an_env_whose_warm_up_fails_is_closed_and_replaced() -> None:
    """A failed warm-up is retried with a new env; the failed one is closed (for ScienceWorld,
    its JVM), not dropped while still running."""
    app = create_app(settings(warm=1))
    closed: list[EnvInstance] = []

    def fail_the_first_warm_up(instance: EnvInstance) -> None:
        if started:
            return

        async def failing_warm_up() -> None:
            raise RuntimeError("the env died while warming up")

        async def recorded_close() -> None:
            closed.append(instance)

        instance.warm_up = failing_warm_up  # type: ignore[method-assign]
        instance.close = recorded_close  # type: ignore[method-assign]

    started = record_env_starts(app.state.manager.backend, fail_the_first_warm_up)
    async with app.router.lifespan_context(app):
        await wait_ready(app)
        assert len(closed) == 1
        assert len(app.state.manager.warm) == 1
        assert closed[0] not in [env.instance for env in app.state.manager.warm]


async def test_metrics_name_openenvs_http_endpoints() -> None:
    async with asgi_client() as client:
        await client.get("/health")
        text = (await client.get("/metrics")).text
        assert 'gymkube_envserver_requests_total{code="ok",endpoint="/health"} 1.0' in text
        assert 'endpoint="other"' not in text


async def test_a_replay_reset_plays_the_same_episode_and_is_counted() -> None:
    async with asgi_client() as client:
        assert (await client.get("/tasks")).json()["replayable"] is True
        session = (await client.post("/create")).json()["id"]
        first = (await client.post("/reset", json={"id": session, "data_idx": 7})).json()
        replay = {"id": session, "data_idx": 7, "replay": True}
        replayed = (await client.post("/reset", json=replay)).json()
        assert replayed["observation"] == first["observation"]
        assert (await client.get("/status")).json()["replays"] == 1
        metrics = (await client.get("/metrics")).text
        assert "gymkube_envserver_replays_total 1.0" in metrics
