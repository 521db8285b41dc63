"""Lost backends, hung backends and a full pool, with real env-server processes."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest
from gymkube_envserver.router.pool import token_address
from router_harness import Procs, play_until_done, wait_all

pytestmark = pytest.mark.unit

LOST_WITHIN_S = 2.0
HUNG_LOST_WITHIN_S = 5.0
SILENT_S = 3.0


def open_sessions(http: httpx.Client, count: int) -> list[str]:
    sessions = []
    for data_idx in range(count):
        session_id = http.post("/create", json={}).json()["id"]
        reset = http.post("/reset", json={"id": session_id, "data_idx": data_idx})
        assert reset.status_code == 200, reset.text
        sessions.append(session_id)
    return sessions


def step_once(http: httpx.Client, session_id: str) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    # Not a move: FrozenLake answers "invalid" without ending the episode.
    response = http.post("/step", json={"id": session_id, "action": "wait"})
    return response, time.monotonic() - started


def split_by_outcome(
    http: httpx.Client, sessions: list[str]
) -> tuple[list[str], list[str], list[float]]:
    """Step every session once: the lost ones, the ones still playing, how long each 410 took."""
    lost, alive, lost_after = [], [], []
    for session_id in sessions:
        response, took = step_once(http, session_id)
        if response.status_code == 410:
            assert response.json()["error"]["code"] == "session_lost"
            lost.append(session_id)
            lost_after.append(took)
        else:
            assert response.status_code == 200, response.text
            assert not response.json()["done"]
            alive.append(session_id)
    return lost, alive, lost_after


def test_killed_backend_loses_its_sessions_fast_and_others_finish(procs: Procs) -> None:
    doomed, survivor = procs.env_server(max_sessions=2), procs.env_server(max_sessions=2)
    # Production polling (1 s, two misses): the 410s must come from the refused connections.
    router = procs.router_for([doomed, survivor], fast_polling=False)
    wait_all(doomed, survivor, router)
    with httpx.Client(base_url=router.url, timeout=30.0) as http:
        sessions = open_sessions(http, 4)
        doomed.signal(signal.SIGKILL)
        assert doomed.popen is not None
        doomed.popen.wait(timeout=10)

        lost, alive, lost_after = split_by_outcome(http, sessions)
        assert len(lost) == 2
        assert len(alive) == 2
        assert max(lost_after) < LOST_WITHIN_S
        for session_id in lost:  # and they stay lost, fast
            response, took = step_once(http, session_id)
            assert response.status_code == 410
            assert took < LOST_WITHIN_S

        for session_id in alive:
            play_until_done(http, session_id)
            assert http.post("/close", json={"id": session_id}).status_code == 200
        assert http.get("/readyz").status_code == 200


def test_hung_backend_answers_410_for_a_step_in_flight(procs: Procs) -> None:
    hung, healthy = procs.env_server(max_sessions=1), procs.env_server(max_sessions=1)
    router = procs.router_for([hung, healthy])
    wait_all(hung, healthy, router)
    with httpx.Client(base_url=router.url, timeout=30.0) as http:
        sessions = open_sessions(http, 2)
        # A stopped process keeps its sockets: connects succeed, answers never come.
        hung.signal(signal.SIGSTOP)
        try:
            lost, alive, lost_after = split_by_outcome(http, sessions)
        finally:
            hung.signal(signal.SIGKILL)
        assert len(lost) == 1
        assert len(alive) == 1
        # Polling every 0.2 s with a 0.5 s timeout, dead after two misses: about a second,
        # with room for a busy machine. What matters is the 410 instead of a hang.
        assert max(lost_after) < HUNG_LOST_WITHIN_S
        for session_id in alive:
            play_until_done(http, session_id)


def test_a_server_silent_for_a_few_seconds_keeps_its_sessions(procs: Procs) -> None:
    # A CPU-starved server on a busy training node answers late, not never: with production
    # settings (dead after 10 s of silence) a 3 s stall, a step in flight through it, costs
    # nothing. (The rule before, two failed 1 s polls, lost these sessions.)
    slow, other = procs.env_server(max_sessions=1), procs.env_server(max_sessions=1)
    router = procs.router_for([slow, other], fast_polling=False)
    wait_all(slow, other, router)
    with httpx.Client(base_url=router.url, timeout=30.0) as http:
        sessions = open_sessions(http, 2)
        slow.signal(signal.SIGSTOP)
        resume = threading.Timer(SILENT_S, slow.signal, (signal.SIGCONT,))
        resume.start()
        try:
            outcomes = [step_once(http, session_id) for session_id in sessions]
        finally:
            resume.join()
        for response, _ in outcomes:
            assert response.status_code == 200, response.text
        assert max(took for _, took in outcomes) >= SILENT_S - 0.5
        for session_id in sessions:
            play_until_done(http, session_id)
            assert http.post("/close", json={"id": session_id}).status_code == 200


def test_a_server_that_stops_answering_gets_no_new_sessions(procs: Procs) -> None:
    silent, other = procs.env_server(max_sessions=2), procs.env_server(max_sessions=2)
    router = procs.router_for([silent, other], fast_polling=False)
    wait_all(silent, other, router)
    with httpx.Client(base_url=router.url, timeout=30.0) as http:
        silent.signal(signal.SIGSTOP)
        try:
            time.sleep(2.5)  # two and a half poll intervals, well inside the dead window
            created = [http.post("/create", json={}) for _ in range(2)]
        finally:
            silent.signal(signal.SIGCONT)
        for response in created:
            assert response.status_code == 200, response.text
            token = response.json()["id"].partition(".")[0]
            assert token_address(token) == other.address


def test_a_call_past_the_request_timeout_fails_instead_of_hanging(procs: Procs) -> None:
    stuck = procs.env_server(max_sessions=1)
    # A server that still counts as alive (polls may fail 1000 times) but never answers.
    router = procs.router_for([stuck], "--dead-after-seconds", "1000", "--request-timeout", "1.5")
    wait_all(stuck, router)
    with httpx.Client(base_url=router.url, timeout=30.0) as http:
        [session_id] = open_sessions(http, 1)
        stuck.signal(signal.SIGSTOP)
        try:
            response, took = step_once(http, session_id)
        finally:
            stuck.signal(signal.SIGKILL)
        assert response.status_code == 500
        assert response.json()["error"]["code"] == "env_failure"
        assert 1.5 <= took < HUNG_LOST_WITHIN_S


def test_full_pool_answers_503_with_retry_after(procs: Procs) -> None:
    backend = procs.env_server(max_sessions=2)
    impatient = procs.router_for([backend], "--create-wait", "0.3", "--retry-after", "3")
    patient = procs.router_for([backend], "--create-wait", "20")
    wait_all(backend, impatient, patient)
    with httpx.Client(base_url=impatient.url, timeout=30.0) as http:
        sessions = [http.post("/create", json={}).json()["id"] for _ in range(2)]

        started = time.monotonic()
        refused = http.post("/create", json={})
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "3"
        assert refused.json()["error"]["code"] == "at_capacity"
        assert 0.3 <= time.monotonic() - started < 5

        # A create that may wait gets the slot a close frees, through another replica.
        waited: list[httpx.Response] = []
        waiter = threading.Thread(
            target=lambda: waited.append(httpx.post(patient.url + "/create", json={}, timeout=30))
        )
        waiter.start()
        time.sleep(0.5)
        assert not waited, "the create should still be waiting for room"
        assert http.post("/close", json={"id": sessions[0]}).status_code == 200
        waiter.join(timeout=10)
        assert [response.status_code for response in waited] == [200]


def test_a_client_that_leaves_during_a_slow_create_leaves_no_session_behind(
    procs: Procs,
) -> None:
    """No warm env: /create starts a ScienceWorld JVM (a second or so). A client that times out
    meanwhile never learns the session id; the router closes that session at once instead of
    leaving its JVM to the server's idle reaper."""
    backend = procs.env_server(max_sessions=2, warm=0, env="sciworld")
    router = procs.router_for([backend])
    wait_all(backend, router)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(router.url + "/create", json={}, timeout=httpx.Timeout(5.0, read=0.1))
    deadline = time.monotonic() + 30
    while not (served := httpx.get(backend.url + "/status").json())["served"]:
        assert time.monotonic() < deadline, "the create never reached the server"
        time.sleep(0.1)
    while served["active"]:
        assert time.monotonic() < deadline, "the orphaned session is still open"
        time.sleep(0.1)
        served = httpx.get(backend.url + "/status").json()
    metrics = httpx.get(router.url + "/metrics").text
    assert "gymkube_router_orphans_closed_total 1.0" in metrics
    # A client that waits gets its session, and keeps it.
    session = httpx.post(router.url + "/create", json={}, timeout=60).json()["id"]
    assert httpx.get(backend.url + "/status").json()["active"] == 1
    httpx.post(router.url + "/close", json={"id": session})


def test_a_terminating_router_serves_new_connections_through_its_shutdown_delay(
    procs: Procs,
) -> None:
    backend = procs.env_server(max_sessions=4)
    router = procs.router_for([backend], "--shutdown-delay", "2")
    wait_all(backend, router)
    assert router.popen is not None
    router.popen.send_signal(signal.SIGTERM)
    # New connections, as from a client whose kube-proxy still lists the pod, are served.
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        with httpx.Client(base_url=router.url, timeout=2.0) as http:
            created = http.post("/create", json={})
            assert created.status_code == 200, created.text
            http.post("/close", json={"id": created.json()["id"]})
        time.sleep(0.2)
    assert router.popen.wait(timeout=10) == 0
