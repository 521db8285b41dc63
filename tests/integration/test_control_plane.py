"""The integration fixture runs a real, access-controlled control plane with working controllers."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import kubernetes
import pytest
from controlplane import ControlPlane, ControlPlaneError
from kubernetes.client.exceptions import ApiException

pytestmark = pytest.mark.integration

T = TypeVar("T")
CONTROLLER_TIMEOUT_S = 60.0


def eventually(
    what: str, probe: Callable[[], T | None], timeout: float = CONTROLLER_TIMEOUT_S
) -> T:
    """Polls probe until it returns something other than None."""
    deadline = time.monotonic() + timeout
    while (result := probe()) is None:
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)
    return result


def test_deployment_gets_a_replicaset_from_the_controller_manager(
    kube: ControlPlane, namespace: str
) -> None:
    deployment = {
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "gymkube.local/web:1"}]},
            },
        },
    }
    with kube.api_client() as client:
        apps = kubernetes.client.AppsV1Api(client)
        created = apps.create_namespaced_deployment(namespace, deployment)

        def owned_replicaset() -> kubernetes.client.V1ReplicaSet | None:
            for rs in apps.list_namespaced_replica_set(namespace).items:
                if any(
                    ref.uid == created.metadata.uid for ref in rs.metadata.owner_references or []
                ):
                    return rs
            return None

        replicaset = eventually("the Deployment's ReplicaSet", owned_replicaset)
    assert replicaset.spec.replicas == 2
    assert replicaset.spec.template.spec.containers[0].image == "gymkube.local/web:1"


def test_dependent_of_a_deleted_owner_is_garbage_collected(
    kube: ControlPlane, namespace: str
) -> None:
    with kube.api_client() as client:
        core = kubernetes.client.CoreV1Api(client)
        owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
        owner_ref = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": "owner",
            "uid": owner.metadata.uid,
        }
        core.create_namespaced_config_map(
            namespace, {"metadata": {"name": "dependent", "ownerReferences": [owner_ref]}}
        )
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "bystander"}})
        core.delete_namespaced_config_map("owner", namespace)

        def dependent_gone() -> bool | None:
            try:
                core.read_namespaced_config_map("dependent", namespace)
            except ApiException as err:
                if err.status == 404:
                    return True
                raise
            return None

        eventually("the garbage collector to delete the dependent", dependent_gone)
        # Only the owned object goes; unrelated objects stay.
        assert core.read_namespaced_config_map("bystander", namespace).metadata.name == "bystander"


def test_rbac_forbids_a_user_until_bound(kube: ControlPlane, namespace: str) -> None:
    alice = kube.kubeconfig_for_user("alice", groups=["gymkube-testers"])
    with kube.api_client(alice) as client:
        core = kubernetes.client.CoreV1Api(client)
        with pytest.raises(ApiException) as forbidden:
            core.list_namespaced_config_map(namespace)
        # 403, not 401: the certificate authenticated alice and RBAC refused her.
        assert forbidden.value.status == 403
        assert 'User "alice"' in json.loads(forbidden.value.body)["message"]

        kube.kubectl(
            "create",
            "rolebinding",
            "alice-view",
            "--clusterrole=view",
            "--user=alice",
            "-n",
            namespace,
        )
        assert eventually(
            "the view binding to take effect",
            lambda: _can_list_config_maps(core, namespace),
        )
    denied = kube.kubectl(
        f"--kubeconfig={alice}", "-n", namespace, "create", "configmap", "x", check=False
    )
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr


def _can_list_config_maps(core: kubernetes.client.CoreV1Api, namespace: str) -> bool | None:
    try:
        core.list_namespaced_config_map(namespace)
    except ApiException as err:
        if err.status == 403:
            return None
        raise
    return True


def test_clients_only_talk_to_the_fixture_cluster(kube: ControlPlane, tmp_path: Path) -> None:
    assert kube.env()["KUBECONFIG"] == str(kube.kubeconfig)
    foreign = tmp_path / "kubeconfig"
    foreign.write_text(kube.kubeconfig.read_text())
    with pytest.raises(ControlPlaneError, match="not a kubeconfig written by this control plane"):
        kube.api_client(foreign)
    with pytest.raises(ControlPlaneError, match="not a kubeconfig written by this control plane"):
        kube.kubectl(f"--kubeconfig={foreign}", "get", "namespaces")
    with pytest.raises(ControlPlaneError, match="only talks to its own cluster"):
        kube.kubectl("--server=https://127.0.0.1:1", "get", "namespaces")
    version = kube.kubectl("version", "-o", "json").stdout
    assert '"gitVersion"' in version
