"""The Helm chart, installed through pyhelm3, gives a Ready operator and established CRDs."""

import pytest
from e2e_cluster import Cluster, E2ESettings, api_path, condition_is, is_ready, wait_until

# Waits inside the tests have their own deadlines; this only bounds a test that hangs outright.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def test_chart_installs_a_ready_operator(operator: Cluster, settings: E2ESettings) -> None:
    for crd in ("envpools.gymkube.io", "trainingruns.gymkube.io"):
        found = operator.get(
            api_path("apiextensions.k8s.io/v1", "customresourcedefinitions", name=crd)
        )
        assert condition_is(found, "Established"), f"CRD {crd} is not Established: {found}"

    selector = f"app.kubernetes.io/instance={settings.release}"
    deployments = operator.names(
        api_path("apps/v1", "deployments", settings.operator_namespace), selector
    )
    assert len(deployments) == 1, f"expected one operator Deployment, found {deployments}"
    path = api_path("apps/v1", "deployments", settings.operator_namespace, deployments[0])
    wait_until(
        lambda: condition_is(operator.get(path), "Available"),
        timeout=120,
        what=f"operator Deployment {deployments[0]} Available",
    )
    pods = operator.pods(settings.operator_namespace, selector)
    assert pods, "the operator Deployment has no pods"
    assert any(is_ready(pod) for pod in pods)
