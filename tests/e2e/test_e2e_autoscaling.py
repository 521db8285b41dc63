"""An autoscaled pool on a real cluster: at zero it keeps its URL, a burst of sessions above its
capacity is held by the router (not refused) while the operator grows the pool for it, every
session plays its episode to the end (counted by the env servers themselves), and the pool goes
back to zero once idle."""

import json
from typing import Any

import pytest
from e2e_cluster import (
    COMPONENT_LABEL,
    POOL_LABEL,
    Cluster,
    api_path,
    envpool_manifest,
    gymkube_path,
    is_ready,
    pool_counts,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

SESSIONS = 6
SESSIONS_PER_REPLICA = 2  # envpool_manifest's default: the burst needs three servers
# Run in the router's pod against its own port: SESSIONS clients at once, each creating a
# session, playing a 2x2 lake to its end a step a second, and closing it. Prints what each got.
BURST = """
import json, threading, time, urllib.error, urllib.request

def call(path, body):
    request = urllib.request.Request(
        "http://127.0.0.1:8000" + path, json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()

outcomes = []
def play(i):
    started = time.monotonic()
    status, created = call("/create", {})
    held = round(time.monotonic() - started, 1)
    if status != 200:
        outcomes.append({"create": status, "body": created})
        return
    session = created["id"]
    status, _ = call("/reset", {"id": session, "data_idx": i})
    done = False
    for turn in range(20):
        status, step = call("/step", {"id": session, "action": ["right", "down"][turn % 2]})
        if status != 200:
            outcomes.append({"step": status, "body": step})
            return
        if step["done"]:
            done = True
            break
        time.sleep(1)
    status, _ = call("/close", {"id": session})
    outcomes.append({"done": done, "close": status, "create_s": held})

threads = [threading.Thread(target=play, args=(i,)) for i in range(SESSIONS)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps(outcomes))
""".replace("SESSIONS", str(SESSIONS))


def _pool(operator: Cluster, namespace: str) -> dict[str, Any]:
    pool = operator.get(gymkube_path("envpools", namespace, "burst"))
    assert pool is not None
    return pool


def _selector(component: str) -> str:
    return f"{POOL_LABEL}=burst,{COMPONENT_LABEL}={component}"


def _at_zero(operator: Cluster, namespace: str) -> bool:
    pool = _pool(operator, namespace)
    conditions = (pool.get("status") or {}).get("conditions", [])
    ready = next((c for c in conditions if c["type"] == "Ready"), {})
    servers = operator.names(api_path("v1", "pods", namespace), _selector("envserver"))
    return pool["spec"]["replicas"] == 0 and ready.get("reason") == "ScaledToZero" and not servers


def _ready_router(operator: Cluster, namespace: str) -> str | None:
    ready = [p for p in operator.pods(namespace, _selector("router")) if is_ready(p)]
    return ready[0]["metadata"]["name"] if ready else None


def _scaled_events(operator: Cluster, namespace: str) -> list[str]:
    selector = "involvedObject.name=burst,reason=Scaled"
    listed = operator.kubectl(
        "get", "events", "-n", namespace, "-o", "json", "--field-selector", selector
    )
    return [event["message"] for event in json.loads(listed)["items"]]


def test_a_burst_at_a_pool_at_zero_is_held_served_and_scaled_back_to_zero(
    operator: Cluster, namespace: str
) -> None:
    # Servers that go take their own episode counts with them: no shrink before they are read.
    autoscaling = {"minReplicas": 0, "maxReplicas": 3, "scaleDownDelaySeconds": 60}
    manifest = envpool_manifest(
        "burst", "frozen_lake", 0, envConfig={"size": 2, "moves": "word"},
        idleTimeoutSeconds=60, autoscaling=autoscaling,
    )  # fmt: skip
    operator.create(gymkube_path("envpools", namespace), manifest)
    wait_until(lambda: _at_zero(operator, namespace), timeout=120, what="the pool at zero")
    # At zero the router is Ready all the same (it holds creates): the pool URL answers.
    router = wait_until(
        lambda: _ready_router(operator, namespace), timeout=120, what="a Ready router at zero"
    )

    played = operator.kubectl(
        "exec", "-n", namespace, router, "-c", "router", "--", "python3", "-c", BURST, timeout=300
    )
    outcomes = json.loads(played.splitlines()[-1])
    print(json.dumps({"e2e_burst": outcomes, "scaled": _scaled_events(operator, namespace)}))
    # Every session was held until a server had room, none refused, and each episode ended.
    ended = [{k: v for k, v in outcome.items() if k != "create_s"} for outcome in outcomes]
    assert ended == [{"done": True, "close": 200}] * SESSIONS, outcomes
    episodes, _ = pool_counts(operator, namespace, "burst")
    assert episodes == SESSIONS
    scaled = _scaled_events(operator, namespace)
    assert any(m.startswith("0 -> ") and "waiting" in m for m in scaled), scaled
    assert max(int(m.split(" -> ")[1].split()[0]) for m in scaled) > 1, scaled

    # Idle for idleTimeoutSeconds: back to zero, each server drained first.
    wait_until(lambda: _at_zero(operator, namespace), timeout=300, what="the pool back at zero")
    assert any(" -> 0 env servers" in m for m in _scaled_events(operator, namespace))
