"""e2e fixtures: the cluster from GYMKUBE_E2E_KUBECONFIG, the operator installed by its Helm chart
through pyhelm3, a namespace per test, and a dump of operator logs, events and pod descriptions
when a test fails.

The e2e tests are opt-in: `pytest tests` deselects them unless GYMKUBE_E2E_KUBECONFIG names a
cluster (`make test-e2e` brings up the local cluster and sets it). Asking for them explicitly
(`-m e2e`) without a cluster is a usage error, never a silent skip.
"""

import fcntl
import os
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from e2e_cluster import (
    OPT_IN,
    TEST_NAMESPACE_LABEL,
    Cluster,
    E2ESettings,
    api_path,
    chart_values,
    gymkube_path,
    wait_until,
)
from gymkube_dev import chart
from gymkube_dev.kube import KubeError
from gymkube_operator.labels import COMPONENT_LABEL

NAMESPACE_DELETE_TIMEOUT_S = 300.0
POOL_DELETE_TIMEOUT_S = 120.0
ENVSERVERS = f"{COMPONENT_LABEL}=envserver"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    e2e = [item for item in items if item.get_closest_marker("e2e")]
    if not e2e or os.environ.get(OPT_IN):
        return
    if re.search(r"\be2e\b", config.option.markexpr or ""):
        raise pytest.UsageError(
            f"the e2e tests need a cluster: set {OPT_IN} to its kubeconfig "
            "(`make test-e2e` starts the local cluster and sets it)"
        )
    config.hook.pytest_deselected(items=e2e)
    items[:] = [item for item in items if not item.get_closest_marker("e2e")]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    # Fixtures read this in teardown to decide whether to dump diagnostics.
    item.stash.setdefault(FAILED_PHASES, set())
    if report.failed:
        item.stash[FAILED_PHASES].add(report.when)
    return report


FAILED_PHASES = pytest.StashKey[set[str]]()


@pytest.fixture(scope="session")
def settings() -> E2ESettings:
    return E2ESettings.model_validate({})  # every field comes from the environment


@pytest.fixture(scope="session")
def cluster(settings: E2ESettings) -> Cluster:
    if not settings.kubeconfig.is_file():
        raise pytest.UsageError(f"{OPT_IN}={settings.kubeconfig} is not a file")
    cluster = Cluster(settings)
    try:
        status, answer = cluster.request("GET", api_path("v1", "namespaces"), query={"limit": "1"})
    except KubeError as err:  # it names the kubeconfig and that nothing answers there
        raise pytest.UsageError(str(err)) from err
    if status != 200:
        raise pytest.UsageError(f"the cluster in {settings.kubeconfig} answered {status}: {answer}")
    return cluster


@contextmanager
def _chart_users(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[int]]:
    """How many of the session's processes use the release (pytest-xdist's workers share one),
    as a one-item list to change, read and written back under a lock on the file that keeps it
    (beside the workers' own temporary directories)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    path = shared / "chart-users"
    with (shared / "chart-users.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        users = [int(path.read_text()) if path.exists() else 0]
        yield users
        path.write_text(str(users[0]))


@pytest.fixture(scope="session")
def operator(
    cluster: Cluster,
    settings: E2ESettings,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Cluster]:
    """The chart installed (or upgraded) through pyhelm3 and uninstalled after the session (unless
    keep_operator); under pytest -n, by the first worker to need it and the last to end."""
    namespace = settings.operator_namespace
    with _chart_users(tmp_path_factory) as users:
        if users[0] == 0:
            values = chart_values(settings)
            chart.install(
                cluster, settings.release, namespace, values, wait=True, chart_dir=settings.chart
            )
        users[0] += 1
    yield cluster
    with _chart_users(tmp_path_factory) as users:
        users[0] -= 1
        others = users[0]
    if others or settings.keep_operator:
        return
    # Test namespaces are deleted without waiting (the next test need not wait for them), but
    # the operator must outlive them: it removes its finalizers from the pools inside.
    namespaces = api_path("v1", "namespaces")
    try:
        wait_until(
            lambda: not cluster.names(namespaces, TEST_NAMESPACE_LABEL),
            timeout=NAMESPACE_DELETE_TIMEOUT_S,
            what="every test namespace (label gymkube-e2e) to be deleted",
        )
    except AssertionError as err:
        raise AssertionError(f"{err}\n{_still_deleting(cluster)}") from None
    chart.uninstall(cluster, settings.release, namespace, wait=False)


def _still_deleting(cluster: Cluster) -> str:
    """What holds up each test namespace: the namespace controller's own conditions (the
    resources and finalizers left) and the pods still terminating, with their grace."""
    lines: list[str] = []
    for ns in cluster.list_objects(api_path("v1", "namespaces"), TEST_NAMESPACE_LABEL):
        name = ns["metadata"]["name"]
        lines.append(f"namespace {name}:")
        for cond in (ns.get("status") or {}).get("conditions") or []:
            if cond.get("status") == "True":
                lines.append(f"  {cond['type']}: {cond.get('message', '')}")
        for pod in cluster.list_objects(api_path("v1", "pods", name)):
            meta = pod["metadata"]
            lines.append(
                f"  pod {meta['name']}: deleting since {meta.get('deletionTimestamp')} "
                f"(grace {meta.get('deletionGracePeriodSeconds')} s), "
                f"phase {(pod.get('status') or {}).get('phase')}"
            )
    return "\n".join(lines)


@pytest.fixture
def namespace(
    request: pytest.FixtureRequest, operator: Cluster, settings: E2ESettings
) -> Iterator[str]:
    """A fresh namespace for one test; on failure its story is printed before it is deleted."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].rstrip("-")
    name = f"e2e-{slug}-{uuid.uuid4().hex[:5]}"
    operator.create(
        api_path("v1", "namespaces"),
        {"metadata": {"name": name, "labels": {TEST_NAMESPACE_LABEL: "true"}}},
    )
    yield name
    if request.node.stash.get(FAILED_PHASES, set()):
        print(operator.dump(name))
    # The pools first, as a user tears down (the operator stops their servers within 30 s), then
    # any env server still there removed at once: deleting the namespace would wait out each
    # server's drain of sessions a test's trainer left open, since a namespace's pods go before
    # its other objects (docs/envpool.md) and the namespace controller looks again only after
    # the longest terminationGracePeriodSeconds of the pods it found (330 s).
    pools = gymkube_path("envpools", name)
    for pool in operator.names(pools):
        operator.delete(gymkube_path("envpools", name, pool))
    wait_until(
        lambda: not operator.names(pools),
        timeout=POOL_DELETE_TIMEOUT_S,
        what=f"{name}'s pools to go",
    )
    for pod in operator.names(api_path("v1", "pods", name), ENVSERVERS):
        operator.delete(api_path("v1", "pods", name, pod), grace_period_seconds=0)
    operator.delete(api_path("v1", "namespaces", name=name))
