"""Images from a registry, and a `helm upgrade` under load: the release is upgraded to take the
operator and every default image from a real registry (the CNCF distribution registry that
hack/registry.sh runs beside the cluster, the images pushed by `make push`) while a pool serves
episodes without pause. The kubelet pulls the new images, the pool's servers are replaced one by
one, and no open session is lost.

The upgrade stays for the rest of the session: the suite's later tests, its CPU training run
among them (the e2e files that train go last), run from the pulled images.
"""

import json
import time
from typing import Any

import pytest
from e2e_cluster import (
    ENVSERVER_PORT,
    Cluster,
    E2ESettings,
    api_path,
    chart_values,
    envpool_manifest,
    envserver_selector,
    gymkube_path,
    wait_until,
)
from gymkube_dev import chart
from gymkube_dev.chart import release_selector
from gymkube_dev.push import CHART_IMAGE_VALUES, pushed_ref, pushed_values
from gymkube_operator.labels import COMPONENT_LABEL, POOL_LABEL

# Solo: it upgrades the release, which another test's upgrade beside it would refuse.
pytestmark = [pytest.mark.e2e, pytest.mark.solo, pytest.mark.timeout(900)]

# Pulled by the pods this test sees start: the operator, the pool's env servers and router.
PULLED = ("operator", "envserver", "router")
LOADERS = 4
ROLL_TIMEOUT_S = 420.0

# Plays FrozenLake episodes through the pool URL from LOADERS threads until /tmp/stop exists,
# each session held for ~10 s of steps (bumping into the lake's edge), then prints what happened:
# a 404 or 410 on an open session is a lost session.
LOADER = """
import json, os, sys, threading, time, urllib.error as e, urllib.request as u
base = sys.argv[1]
counts = {"episodes": 0, "steps": 0, "lost": 0, "create_busy": 0, "create_failed": 0,
          "transport": 0, "other": []}
lock = threading.Lock()

def call(path, body):
    headers = {"Content-Type": "application/json"}
    request = u.Request(base + path, json.dumps(body).encode(), headers)
    with u.urlopen(request, timeout=30) as reply:
        return json.load(reply)

def bump(key, detail=None):
    with lock:
        if detail is None:
            counts[key] += 1
        else:
            counts[key].append(detail)

def play(worker):
    episode = 0
    while not os.path.exists("/tmp/stop"):
        try:
            sid = call("/create", {})["id"]
        except e.HTTPError as err:
            bump("create_busy" if err.code == 503 else "create_failed")
            time.sleep(0.5)
            continue
        except OSError:
            bump("create_failed")
            time.sleep(0.5)
            continue
        try:
            call("/reset", {"id": sid, "data_idx": worker * 1000 + episode})
            for _ in range(20):
                time.sleep(0.5)
                call("/step", {"id": sid, "action": "<action>up</action>"})
                bump("steps")
            call("/close", {"id": sid})
            bump("episodes")
        except e.HTTPError as err:
            if err.code in (404, 410):
                bump("lost")
            else:
                bump("other", f"{err.code}: {err.read()[:200]!r}")
        except OSError as err:
            bump("transport")
            bump("other", repr(err))
        episode += 1

threads = [threading.Thread(target=play, args=(n,)) for n in range(int(sys.argv[2]))]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps(counts))
"""


def _images(pod: dict[str, Any]) -> set[str]:
    return {str(container["image"]) for container in pod["spec"]["containers"]}


def _pulled(operator: Cluster, namespace: str) -> set[str]:
    """Images the kubelet reports it pulled (not found present) for pods in NAMESPACE."""
    status, events = operator.request(
        "GET", api_path("v1", "events", namespace), query={"fieldSelector": "reason=Pulled"}
    )
    assert status == 200, events
    pulled = set()
    for event in events.get("items", []):
        message = str(event.get("message", ""))
        if message.startswith("Successfully pulled image"):
            pulled.add(message.split('"')[1])
    return pulled


def _loader_pod(settings: E2ESettings, url: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "loader"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "loader",
                    "image": settings.image("envserver"),
                    "imagePullPolicy": settings.image_pull_policy,
                    "command": ["python3", "-c", LOADER, url, str(LOADERS)],
                }
            ],
        },
    }


def test_an_upgrade_to_images_from_a_registry_loses_no_session_of_a_serving_pool(
    operator: Cluster, settings: E2ESettings, namespace: str
) -> None:
    if not settings.registry:
        pytest.skip(
            "no registry beside this cluster (GYMKUBE_E2E_REGISTRY; hack/test-e2e.sh runs one)"
        )
    registry = settings.registry
    pool = envpool_manifest(
        "lake",
        "frozen_lake",
        2,
        sessionsPerReplica=8,
        envConfig={"size": 4, "layout": "classic", "max_steps": 1000},
    )
    operator.create(gymkube_path("envpools", namespace), pool)
    operator.wait_pool_ready(namespace, "lake", extra=lambda p: p["status"]["readyReplicas"] == 2)
    url = f"http://lake.{namespace}.svc:{ENVSERVER_PORT}"
    operator.create(api_path("v1", "pods", namespace), _loader_pod(settings, url))
    wait_until(lambda: operator.pod_ready(namespace, "loader"), timeout=120, what="the loader pod")
    time.sleep(15)  # sessions open on both servers before the upgrade starts

    # helm upgrade: every image from the registry; the chart's own --wait for the new operator.
    names = list(CHART_IMAGE_VALUES)
    values = chart.merged_values(chart_values(settings), pushed_values(registry, names))
    started = time.monotonic()
    chart.install(
        operator,
        settings.release,
        settings.operator_namespace,
        values,
        wait=True,
        chart_dir=settings.chart,
    )

    # The new operator rolls the pool onto the pulled images, a server at a time, each draining
    # its sessions first.
    selectors = {
        "envserver": envserver_selector("lake"),
        "router": f"{POOL_LABEL}=lake,{COMPONENT_LABEL}=router",
    }

    def rolled() -> bool:
        for name, selector in selectors.items():
            pods = operator.pods(namespace, selector)
            want = pushed_ref(registry, name, settings.image_tag)
            ready = [pod for pod in pods if operator.pod_ready(namespace, pod["metadata"]["name"])]
            if len(ready) != (2 if name == "envserver" else 1) or any(
                _images(pod) != {want} for pod in pods
            ):
                return False
        return True

    wait_until(rolled, timeout=ROLL_TIMEOUT_S, interval=2, what="the pool on the pulled images")
    rolled_s = time.monotonic() - started
    time.sleep(10)  # and episodes on the new servers
    operator.kubectl("exec", "-n", namespace, "loader", "--", "touch", "/tmp/stop")
    wait_until(
        lambda: (
            (operator.get(api_path("v1", "pods", namespace, "loader")) or {})
            .get("status", {})
            .get("phase")
            == "Succeeded"
        ),
        timeout=60,
        what="the loader to finish its episodes",
    )
    counts = json.loads(operator.kubectl("logs", "-n", namespace, "loader").splitlines()[-1])
    print(json.dumps({"e2e_upgrade_under_load": counts, "rolled_s": round(rolled_s, 1)}))

    assert counts["lost"] == 0, counts
    assert counts["other"] == [], counts
    assert counts["episodes"] >= LOADERS * 2, counts

    # The operator and the pool's pods run the registry's images, which the kubelet pulled.
    operator_pods = operator.pods(
        settings.operator_namespace,
        f"{release_selector(settings.release)},{COMPONENT_LABEL}=operator",
    )
    running = [
        _images(pod)
        for pod in operator_pods
        if operator.pod_ready(settings.operator_namespace, pod["metadata"]["name"])
    ]
    assert running == [{pushed_ref(registry, "operator", settings.image_tag)}]
    pulled = _pulled(operator, namespace) | _pulled(operator, settings.operator_namespace)
    for name in PULLED:
        assert pushed_ref(registry, name, settings.image_tag) in pulled, pulled
