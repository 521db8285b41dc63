"""The Helm chart, installed through pyhelm3, gives a Ready operator and established CRDs."""

import pytest
from e2e_cluster import Cluster, E2ESettings, wait_until

pytestmark = pytest.mark.e2e


def test_chart_installs_a_ready_operator(operator: Cluster, settings: E2ESettings) -> None:
    for crd in ("envpools.gymkube.io", "trainingruns.gymkube.io"):
        established = operator.apiext.read_custom_resource_definition(crd)
        assert any(
            c.type == "Established" and c.status == "True" for c in established.status.conditions
        ), f"CRD {crd} is not Established"

    selector = f"app.kubernetes.io/instance={settings.release}"
    deployments = operator.apps.list_namespaced_deployment(
        settings.operator_namespace, label_selector=selector
    ).items
    assert len(deployments) == 1, f"expected one operator Deployment, found {len(deployments)}"
    name = deployments[0].metadata.name

    def available() -> bool:
        status = operator.apps.read_namespaced_deployment(name, settings.operator_namespace).status
        return any(c.type == "Available" and c.status == "True" for c in status.conditions or [])

    wait_until(available, timeout=120, what=f"operator Deployment {name} Available")
    pods = operator.pods(settings.operator_namespace, selector)
    assert pods, "the operator Deployment has no pods"
    assert all(operator.pod_ready(settings.operator_namespace, p.metadata.name) for p in pods)
