"""Integration fixtures: one private control plane per session, one namespace per test, the
CRDs and an operator for it (modules that need other ones define their own)."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest
from controlplane import ControlPlane, running_control_plane
from operator_support import Cluster, OperatorProcess, install_crds, running_operator

SERVICE_ACCOUNT_TIMEOUT_S = 60.0
_startup_seconds = pytest.StashKey[float]()


@pytest.fixture(scope="session")
def kube(pytestconfig: pytest.Config) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver + kube-controller-manager, started once for the whole session."""
    with running_control_plane() as control_plane:
        pytestconfig.stash[_startup_seconds] = control_plane.startup_seconds
        yield control_plane


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    if _startup_seconds in config.stash:
        seconds = config.stash[_startup_seconds]
        terminalreporter.write_line(f"integration control plane started in {seconds:.1f}s")


@pytest.fixture
def namespace(kube: ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace named after the test, ready for pods (its default service account
    exists); deleted after the test."""
    stem = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].rstrip("-")
    name = f"{stem}-{secrets.token_hex(3)}"
    with kube.api_client() as client:
        core = kubernetes.client.CoreV1Api(client)
        core.create_namespace(kubernetes.client.V1Namespace(metadata={"name": name}))
        deadline = time.monotonic() + SERVICE_ACCOUNT_TIMEOUT_S
        while not core.list_namespaced_service_account(
            name, field_selector="metadata.name=default"
        ).items:
            if time.monotonic() > deadline:
                pytest.fail(f"namespace {name}: no default service account in time")
            time.sleep(0.1)
        yield name
        core.delete_namespace(name)


@pytest.fixture
def cluster(kube: ControlPlane, namespace: str) -> Iterator[Cluster]:
    """The test's namespace, every gymkube CRD installed (applying them again changes nothing)."""
    install_crds(kube)
    with kube.api_client() as client:
        yield Cluster(client, namespace)


@pytest.fixture
def operator(kube: ControlPlane, cluster: Cluster, tmp_path: Path) -> Iterator[OperatorProcess]:
    """`gymkube-operator` watching the test's namespace."""
    with running_operator(kube, cluster, tmp_path / "operator.log") as process:
        yield process
