"""The router in front of two real FrozenLake env servers: placement, replicas, pass-through."""

from __future__ import annotations

import time
from dataclasses import dataclass

import aiohttp
import httpx
import pytest
import requests
from gymkube_agentloop.client import EnvClient
from gymkube_envserver.router.pool import address_token, token_address
from gymkube_envserver.router.status import RouterStatus
from gymkube_envserver.wire import MAX_ACTION_CHARS
from router_harness import Proc, Procs, active_sessions, backend_id, play_until_done, wait_all

pytestmark = pytest.mark.unit


@dataclass
class Pool:
    small: Proc
    big: Proc
    router: Proc
    replica: Proc


@pytest.fixture(scope="module")
def pool(module_procs: Procs) -> Pool:
    small = module_procs.env_server(max_sessions=2)
    big = module_procs.env_server(max_sessions=8)
    router = module_procs.router_for([small, big], "--create-wait", "0.2")
    replica = module_procs.router_for([small, big], "--create-wait", "0.2")
    wait_all(small, big, router, replica)
    return Pool(small, big, router, replica)


def client(proc: Proc) -> httpx.Client:
    return httpx.Client(base_url=proc.url, timeout=10.0)


def create(http: httpx.Client) -> str:
    response = http.post("/create", json={})
    assert response.status_code == 200, response.text
    session_id: str = response.json()["id"]
    return session_id


def wait_idle(*backends: Proc) -> None:
    """Earlier tests closed their sessions; wait until the servers and the router polls agree."""
    deadline = time.monotonic() + 5
    while any(active_sessions(b) for b in backends):
        assert time.monotonic() < deadline, "sessions of an earlier test are still open"
        time.sleep(0.05)
    time.sleep(0.5)


def test_sessions_go_where_most_slots_are_free(pool: Pool) -> None:
    wait_idle(pool.small, pool.big)
    with client(pool.router) as http:
        first = [create(http) for _ in range(4)]
        # 8 free beats 2 free until the big server is down to 2 free slots as well (with one
        # to spare, should a poll cross a create in flight).
        assert (active_sessions(pool.small), active_sessions(pool.big)) == (0, 4)
        rest = [create(http) for _ in range(6)]
        assert (active_sessions(pool.small), active_sessions(pool.big)) == (2, 8)
        for session_id in first + rest:
            assert http.post("/close", json={"id": session_id}).status_code == 200


def test_a_draining_server_gets_no_new_sessions_but_keeps_its_own(pool: Pool) -> None:
    wait_idle(pool.small, pool.big)
    with client(pool.router) as http:
        on_big = create(http)  # most free slots
        assert http.post("/reset", json={"id": on_big, "data_idx": 4}).status_code == 200
        assert httpx.post(pool.big.url + "/admin/drain", json={"draining": True}).is_success
        try:
            wait_for_state(http, pool.big, "draining")
            placed = [create(http) for _ in range(2)]
            assert (active_sessions(pool.small), active_sessions(pool.big)) == (2, 1)
            play_until_done(http, on_big)
        finally:
            httpx.post(pool.big.url + "/admin/drain", json={"draining": False})
        for session_id in [on_big, *placed]:
            assert http.post("/close", json={"id": session_id}).status_code == 200


def wait_for_state(http: httpx.Client, backend: Proc, state: str) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        status = RouterStatus.model_validate_json(http.get("/status").content)
        if any(b.address == backend.address and b.state == state for b in status.backends):
            return
        time.sleep(0.05)
    pytest.fail(f"the router never saw {backend.address} {state}")


def test_two_replicas_route_each_others_sessions(pool: Pool) -> None:
    with client(pool.router) as one, client(pool.replica) as two:
        from_one, from_two = create(one), create(two)
        for session_id, other in ((from_one, two), (from_two, one)):
            reset = other.post("/reset", json={"id": session_id, "data_idx": 5})
            assert reset.status_code == 200, reset.text
            assert reset.json()["id"] == session_id
        play_until_done(two, from_one)
        play_until_done(one, from_two)
        assert two.post("/close", json={"id": from_one}).json()["was_open"] is True
        assert one.post("/close", json={"id": from_two}).json()["was_open"] is True


def test_a_restarted_router_keeps_routing_existing_sessions(pool: Pool, procs: Procs) -> None:
    router = procs.router_for([pool.small, pool.big])
    router.wait_ready()
    with client(router) as http:
        session_id = create(http)
        assert http.post("/reset", json={"id": session_id, "data_idx": 1}).status_code == 200
    router.stop()
    restarted = procs.router_for([pool.small, pool.big], port=router.port)
    restarted.wait_ready()
    with client(restarted) as http:
        play_until_done(http, session_id)
        assert http.post("/close", json={"id": session_id}).status_code == 200


def test_a_connection_the_server_closed_while_idle_is_not_a_lost_session(
    pool: Pool, procs: Procs
) -> None:
    # uvicorn drops idle keep-alive connections after 5 s; this router would keep them 30 s
    # and, polling only every 30 s, leaves its connections idle meanwhile.
    router = procs.router_for(
        [pool.small, pool.big], "--keepalive-timeout", "30", "--poll-interval", "30"
    )
    router.wait_ready()
    with client(router) as http:
        session_id = create(http)
        assert http.post("/reset", json={"id": session_id, "data_idx": 6}).status_code == 200
        time.sleep(5.5)
        play_until_done(http, session_id)
        assert http.post("/close", json={"id": session_id}).status_code == 200


def _direct(pool: Pool, session_id: str) -> httpx.Client:
    address = token_address(session_id.partition(".")[0])
    backend = pool.small if address == pool.small.address else pool.big
    assert address == backend.address
    return client(backend)


def test_backend_errors_pass_through_unchanged(pool: Pool) -> None:
    with client(pool.router) as http:
        session_id = create(http)
        inner = backend_id(session_id)
        with _direct(pool, session_id) as direct:
            cases = [
                ("/step", {"action": "<action>up</action>"}),  # before the first reset: 409
                ("/reset", {"data_idx": 10**9}),  # out of range: 422
                ("/step", {"action": "x" * (MAX_ACTION_CHARS + 1)}),  # too long: 422
            ]
            for path, body in cases:
                routed = http.post(path, json={"id": session_id, **body})
                straight = direct.post(path, json={"id": inner, **body})
                assert 400 <= routed.status_code < 500
                assert routed.status_code == straight.status_code
                assert routed.content == straight.content
                assert routed.headers["content-type"] == straight.headers["content-type"]
            http.post("/close", json={"id": session_id})
            routed = http.post("/step", json={"id": session_id, "action": "up"})
            straight = direct.post("/step", json={"id": inner, "action": "up"})
            assert (routed.status_code, routed.content) == (404, straight.content)


def test_ids_the_router_never_issued_are_unknown_sessions(pool: Pool) -> None:
    with client(pool.router) as http:
        for session_id in ("no-dot", "", f"{address_token('no-port')}.5", 7):
            response = http.post("/step", json={"id": session_id, "action": "up"})
            assert response.status_code == 404, response.text
            assert response.json()["error"]["code"] == "session_not_found"
        # A well-formed id naming a server outside the pool: its session cannot be reached.
        response = http.post("/step", json={"id": f"{address_token('10.9.9.9:80')}.5"})
        assert response.status_code == 410
        assert response.json()["error"]["code"] == "session_lost"
        response = http.post("/step", content=b"not json")
        assert response.status_code == 422
        assert response.json()["error"]["code"] == "bad_request"
        response = http.post("/step", content=b" " * (2 * 2**20))
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "payload_too_large"


def test_agentgym_client_flow_works_unchanged(pool: Pool) -> None:
    # The calls AgentGym's SciworldEnvClient makes, with `requests`, ids taken verbatim.
    base = pool.router.url
    env_id = requests.post(f"{base}/create", timeout=300).json()["id"]
    info = requests.post(f"{base}/reset", json={"id": env_id, "data_idx": 7}, timeout=300).json()
    assert "error" not in info
    assert info["task_description"]
    assert info["observation"]
    observation = requests.get(f"{base}/observation", params={"id": env_id}, timeout=300).json()
    assert observation == info["observation"]
    done, steps = False, 0
    while not done:
        step = requests.post(
            f"{base}/step", json={"id": env_id, "action": "<action>down</action>"}, timeout=300
        ).json()
        assert "error" not in step
        done, steps = step["done"], steps + 1
    detail = requests.get(f"{base}/detail", params={"id": env_id}, timeout=300).json()
    assert (detail["id"], detail["done"], detail["steps"]) == (env_id, True, steps)
    assert requests.post(f"{base}/close", json={"id": env_id}, timeout=300).status_code == 200


async def test_seed_agentloop_flow_works_unchanged(pool: Pool) -> None:
    # The seed AgentLoop: aiohttp, POST {base}/{path} with json, looks for "error" in replies.
    base = pool.replica.url
    async with aiohttp.ClientSession() as session:

        async def post(path: str, payload: dict[str, object]) -> dict[str, object]:
            async with session.post(f"{base}/{path}", json=payload) as response:
                reply: dict[str, object] = await response.json()
                return reply

        created = await post("create", {})
        env_id = created["id"]
        obs = await post("reset", {"id": env_id, "data_idx": 11})
        assert "error" not in obs
        assert not obs["done"]
        done = False
        for _ in range(40):
            step = await post("step", {"id": env_id, "action": "<action>right</action>"})
            assert "error" not in step
            if done := bool(step["done"]):
                break
        assert done
        assert "error" not in await post("close", {"id": env_id})


async def test_gymkube_env_client_plays_through_the_router(pool: Pool) -> None:
    async with aiohttp.ClientSession() as session:
        env = EnvClient(pool.router.url, session=session)
        assert (await env.tasks()).count > 0
        session_id = await env.create()
        reset = await env.reset(session_id, data_idx=3)
        assert not reset.done
        for _ in range(40):
            if (await env.step(session_id, "<action>left</action>")).done:
                break
        else:
            pytest.fail("episode did not end")
        await env.close(session_id)


def test_tasks_status_metrics_and_probes(pool: Pool) -> None:
    with client(pool.router) as http:
        for path in ("/tasks", "/"):
            assert http.get(path).content == httpx.get(pool.small.url + path).content
        assert http.get("/healthz").status_code == 200
        assert http.get("/readyz").json()["ready"] is True
        session_id = create(http)
        http.post("/reset", json={"id": session_id, "data_idx": 0})
        http.post("/step", json={"id": session_id, "action": "<action>up</action>"})
        http.post("/close", json={"id": session_id})

        status = RouterStatus.model_validate_json(http.get("/status").content)
        assert status.ready
        assert status.backends_total == 2
        assert status.backends_ready == 2
        assert status.capacity == 10
        assert {b.address for b in status.backends} == {pool.small.address, pool.big.address}
        assert status.placed == sum(b.placed for b in status.backends) > 0

        metrics = http.get("/metrics").text
        assert 'gymkube_router_added_latency_seconds_bucket{endpoint="/step",le="0.001"}' in metrics
        assert 'gymkube_router_requests_total{code="200",endpoint="/step"}' in metrics
        assert f'gymkube_router_sessions_placed_total{{backend="{pool.big.address}"}}' in metrics


def test_backends_found_through_dns(pool: Pool, procs: Procs) -> None:
    router = procs.router("--backends-dns", f"localhost:{pool.small.port}")
    router.wait_ready()
    with client(router) as http:
        status = RouterStatus.model_validate_json(http.get("/status").content)
        assert [b.address for b in status.backends] == [pool.small.address]
        session_id = create(http)
        assert http.post("/reset", json={"id": session_id, "data_idx": 2}).status_code == 200
        play_until_done(http, session_id)
        assert http.post("/close", json={"id": session_id}).status_code == 200
