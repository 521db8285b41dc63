"""A pool's NetworkPolicy on a real cluster: it exists, its selectors pick the pool's real pods and
the real operator pod, the pool works under it, /admin/* is not served on the session port, and,
where the network plugin enforces NetworkPolicy (Cilium on kind, hack/cilium.sh), a monitoring
namespace the chart names scrapes the env servers' /metrics while other pods are kept out.

The local cluster's CNI bridge does not enforce NetworkPolicy; there the refusal test is skipped
(GYMKUBE_E2E_NETWORK_POLICY_ENFORCED unset) and the rest runs (docs/envpool.md#network-policy).
"""

import json
from collections.abc import Iterator

import pytest
from e2e_cluster import (
    ENVSERVER_PORT,
    SCRAPER_NAMESPACE_LABELS,
    TEST_NAMESPACE_LABEL,
    Cluster,
    E2ESettings,
    Object,
    api_path,
    envpool_manifest,
    envserver_selector,
    gymkube_path,
    wait_until,
)
from gymkube_operator.labels import COMPONENT_LABEL, POOL_LABEL

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def _selector(match_labels: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(match_labels.items()))


def _names(objects: list[Object]) -> set[str]:
    return {str(obj["metadata"]["name"]) for obj in objects}


def test_the_pool_policy_selects_its_real_pods_and_the_pool_works_under_it(
    operator: Cluster, settings: E2ESettings, namespace: str
) -> None:
    operator.create(gymkube_path("envpools", namespace), envpool_manifest("lake", "frozen_lake", 2))
    operator.wait_pool_ready(namespace, "lake")
    policy = operator.get(
        api_path("networking.k8s.io/v1", "networkpolicies", namespace, "lake-envservers")
    )
    assert policy is not None, "the chart's default (networkPolicy.enabled) gives pools a policy"
    spec = policy["spec"]

    servers = operator.pods(namespace, envserver_selector("lake"))
    assert len(servers) == 2
    isolated = operator.pods(namespace, _selector(spec["podSelector"]["matchLabels"]))
    assert _names(isolated) == _names(servers)

    sessions_rule, admin_rule = spec["ingress"]
    assert [p["port"] for p in sessions_rule["ports"]] == ["http"]
    assert [p["port"] for p in admin_rule["ports"]] == ["admin"]
    routers = operator.pods(namespace, f"{POOL_LABEL}=lake,{COMPONENT_LABEL}=router")
    pod_peers = [peer for peer in sessions_rule["from"] if "namespaceSelector" not in peer]
    admitted = set().union(
        *(_names(operator.pods(namespace, _selector(p["podSelector"]["matchLabels"])))
          for p in pod_peers)
    )  # fmt: skip
    assert _names(routers) <= admitted
    assert not _names(servers) & admitted, "env servers do not admit each other"

    (operator_peer,) = admin_rule["from"]
    assert operator_peer in sessions_rule["from"]
    operator_namespaces = operator.list_objects(
        api_path("v1", "namespaces"), _selector(operator_peer["namespaceSelector"]["matchLabels"])
    )
    assert _names(operator_namespaces) == {settings.operator_namespace}
    operator_pods = operator.pods(
        settings.operator_namespace, _selector(operator_peer["podSelector"]["matchLabels"])
    )
    assert len(operator_pods) == 1
    assert operator_pods[0]["metadata"]["labels"][COMPONENT_LABEL] == "operator"

    # The pool works through its URL from a router pod, which the policy lets in.
    router = str(routers[0]["metadata"]["name"])
    server = str(servers[0]["metadata"]["name"])
    # Ready means the pods are; kube-proxy may program the Service's endpoints a moment later
    # (until then it refuses connections), so the client retries a refused connect for a while.
    played = operator.exec_python(
        namespace,
        router,
        "import json, time, urllib.request as u\n"
        f"base = 'http://lake.{namespace}.svc:{ENVSERVER_PORT}'\n"
        "req = lambda p, b: json.load(u.urlopen(u.Request(base + p, json.dumps(b).encode(),"
        " {'Content-Type': 'application/json'}), timeout=10))\n"
        "for attempt in range(30):\n"
        "    try:\n        sid = req('/create', {})['id']\n        break\n"
        "    except OSError:\n        time.sleep(1)\n"
        "print(json.dumps(req('/reset', {'id': sid, 'data_idx': 0})))\n"
        "req('/close', {'id': sid})\n",
    )
    assert "FrozenLake" in json.loads(played)["task_description"]

    # /admin/* answers only on the admin port: a client that may play cannot drain a server.
    server_ip = servers[0]["status"]["podIP"]
    answer = operator.exec_python(
        namespace,
        router,
        "import urllib.request as u, urllib.error as e\n"
        f"r = u.Request('http://{server_ip}:{ENVSERVER_PORT}/admin/drain', b'', method='POST')\n"
        "try:\n    u.urlopen(r, timeout=10)\nexcept e.HTTPError as err:\n    print(err.code)\n",
    )
    assert answer.strip() == "404"
    assert operator.pod_ready(namespace, server) is not None, "the server did not drain"


# What a scrape answers from inside a pod: the HTTP status and the body, or the error when the
# network gave no answer (a policy drops the packets: the connect times out).
SCRAPE = """
import json, sys, urllib.request as u
answers = {}
for url in json.loads(sys.argv[1]):
    try:
        with u.urlopen(url, timeout=5) as answer:
            answers[url] = {"status": answer.status, "body": answer.read().decode()}
    except OSError as err:
        answers[url] = {"error": repr(err)}
print(json.dumps(answers))
"""


def _idle_pod(name: str, image: str, pull_policy: str) -> Object:
    """A pod that only waits, from a gymkube image (which carries Python), for kubectl exec."""
    return {
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": pull_policy,
                    "command": ["python3", "-c", "import time; time.sleep(3600)"],
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


def _scrape(operator: Cluster, namespace: str, pod: str, urls: list[str]) -> dict[str, Object]:
    out = operator.kubectl(
        "exec", "-n", namespace, pod, "--", "python3", "-c", SCRAPE, json.dumps(urls)
    )
    answers: dict[str, Object] = json.loads(out)
    return answers


@pytest.fixture
def scraper_namespace(operator: Cluster, namespace: str) -> Iterator[str]:
    """A namespace labelled as the chart's metricsScrapers name, like a user's monitoring one."""
    name = f"{namespace}-mon"[:63]
    operator.create(
        api_path("v1", "namespaces"),
        {"metadata": {"name": name, "labels": {TEST_NAMESPACE_LABEL: "true",
                                                **SCRAPER_NAMESPACE_LABELS}}},
    )  # fmt: skip
    yield name
    operator.delete(api_path("v1", "namespaces", name=name))


def test_an_enforced_policy_lets_the_named_scrapers_in_and_keeps_other_pods_out(
    operator: Cluster, settings: E2ESettings, namespace: str, scraper_namespace: str
) -> None:
    if not settings.network_policy_enforced:
        pytest.skip(
            "the cluster's network plugin does not enforce NetworkPolicy; hack/test-e2e.sh makes "
            "Cilium kind's CNI and sets GYMKUBE_E2E_NETWORK_POLICY_ENFORCED=true"
        )
    operator.create(gymkube_path("envpools", namespace), envpool_manifest("lake", "frozen_lake", 2))
    image = settings.image("router")
    operator.create(
        api_path("v1", "pods", scraper_namespace),
        _idle_pod("prometheus", image, settings.image_pull_policy),
    )
    # A pod beside the pool that is none of its routers, clients or the operator.
    operator.create(api_path("v1", "pods", namespace),
                    _idle_pod("bystander", image, settings.image_pull_policy))  # fmt: skip
    operator.wait_pool_ready(namespace, "lake")
    for ns, pod in ((scraper_namespace, "prometheus"), (namespace, "bystander")):
        wait_until(
            lambda ns=ns, pod=pod: operator.pod_ready(ns, pod),  # type: ignore[misc]
            timeout=settings.pod_start_timeout_s,
            what=f"pod {ns}/{pod} Ready",
        )

    # What a Prometheus scrapes: each env server by its pod address (a ServiceMonitor's
    # endpoints), the router through the pool's Service, and the operator by its pod address
    # (the chart's PodMonitor).
    servers = [f"http://{pod['status']['podIP']}:{ENVSERVER_PORT}/metrics"
               for pod in operator.pods(namespace, envserver_selector("lake"))]  # fmt: skip
    assert len(servers) == 2
    router = f"http://lake.{namespace}.svc:{ENVSERVER_PORT}/metrics"
    (operator_pod,) = operator.pods(settings.operator_namespace, f"{COMPONENT_LABEL}=operator")
    ports = operator_pod["spec"]["containers"][0]["ports"]
    (metrics_port,) = [port["containerPort"] for port in ports if port["name"] == "metrics"]
    operator_metrics = f"http://{operator_pod['status']['podIP']}:{metrics_port}/metrics"
    families = {router: "gymkube_router_requests", operator_metrics: "gymkube_operator_reconciles",
                **{url: "gymkube_envserver_requests" for url in servers}}  # fmt: skip

    # A new pod's policy identity can lag its Ready by a moment: the scrape is retried until every
    # target answers, then each must answer with its own families.
    def scraped() -> dict[str, Object] | None:
        answers = _scrape(operator, scraper_namespace, "prometheus", list(families))
        return answers if all("status" in a for a in answers.values()) else None

    answers = wait_until(scraped, timeout=60, what="the scraper to reach each /metrics", interval=2)
    for url, family in families.items():
        assert answers[url]["status"] == 200, url
        assert family in answers[url]["body"], f"{url} has no {family}"

    # The bystander reaches the router (no policy there) but not the env servers: the refusal is
    # the pool's policy, not a broken network.
    refused = _scrape(operator, namespace, "bystander", [router, *servers])
    assert refused[router].get("status") == 200, refused[router]
    for url in servers:
        assert "error" in refused[url], f"the bystander read {url}: the policy is not enforced"
