"""A pool's NetworkPolicy on a real cluster: it exists, its selectors pick the pool's real pods and
the real operator pod, the pool works under it, and /admin/* is not served on the session port.

Whether traffic is dropped depends on the cluster's network plugin; the local cluster's CNI bridge
does not enforce NetworkPolicy, so refusal by the network itself is not asserted here
(docs/envpool.md#network-policy).
"""

import json

import pytest
from e2e_cluster import (
    ENVSERVER_PORT,
    Cluster,
    E2ESettings,
    Object,
    api_path,
    envpool_manifest,
    envserver_selector,
    gymkube_path,
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
