"""docs/install.md's uninstall, run as written against a real API server: in the documented order
everything goes; with the operator gone first, the documented way out frees what its finalizer
holds."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from controlplane import ControlPlane, running_control_plane
from gymkube_operator.crds.catalog import RESOURCES
from gymkube_operator.kinds import GROUP, VERSION
from operator_support import (
    Cluster,
    OperatorProcess,
    envpool,
    eventually,
    running_operator,
)

pytestmark = pytest.mark.integration

INSTALL_DOC = Path(__file__).parents[2] / "docs" / "install.md"
FINALIZER = "gymkube.io/finalizer"
HELM_UNINSTALL = re.compile(r"^\$B/helm uninstall .*$", re.MULTILINE)


def uninstall_blocks() -> list[str]:
    """The shell blocks of the "### Uninstall" section: the order, then the way out."""
    section = INSTALL_DOC.read_text().split("### Uninstall", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, re.DOTALL)


def run_shell(kube: ControlPlane, script: str) -> None:
    env = kube.env()
    env["PATH"] = f"{kube.bin_dir}{os.pathsep}{env['PATH']}"
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{script}\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def kube() -> Iterator[ControlPlane]:
    """A control plane of this module's own: the documented commands act on every namespace and
    delete the CRDs, which the other tests' shared one must keep."""
    with running_control_plane() as control_plane:
        yield control_plane


def training_run(name: str, pool: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingRun",
        "metadata": {"name": name},
        "spec": {"envPoolRef": {"name": pool}, "model": {"path": "/models/q"}},
    }


def create_finalized(cluster: Cluster) -> None:
    """A pool and a run, once the operator has put its finalizer on both."""
    cluster.create(envpool("lake"))
    cluster.custom.create_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, "trainingruns", training_run("train", "lake")
    )
    for plural, name in (("envpools", "lake"), ("trainingruns", "train")):

        def finalized(plural: str = plural, name: str = name) -> bool | None:
            found = cluster.custom.get_namespaced_custom_object(
                GROUP, VERSION, cluster.namespace, plural, name
            )
            return True if FINALIZER in found["metadata"].get("finalizers", []) else None

        eventually(f"the operator's finalizer on {plural}/{name}", finalized)


def gone(cluster: Cluster, plural: str, name: str) -> bool | None:
    try:
        cluster.custom.get_namespaced_custom_object(GROUP, VERSION, cluster.namespace, plural, name)
    except kubernetes.client.ApiException as error:
        if error.status == 404:
            return True
        raise
    return None


def test_uninstall_in_the_documented_order_removes_everything(
    kube: ControlPlane, cluster: Cluster, tmp_path: Path
) -> None:
    order, _ = uninstall_blocks()
    assert HELM_UNINSTALL.search(order), order
    deletes, crds = HELM_UNINSTALL.split(order)
    assert set(crds.split()[3:]) == {resource.name for resource in RESOURCES}
    with running_operator(kube, cluster, tmp_path / "operator.log"):
        create_finalized(cluster)
        run_shell(kube, deletes)
    # Here the release would be uninstalled: the operator has stopped.
    run_shell(kube, crds)
    found = kube.kubectl("get", "crd", "-o", "name").stdout
    assert not any(resource.name in found for resource in RESOURCES)


def test_with_the_operator_gone_the_documented_way_out_frees_deleted_objects(
    kube: ControlPlane, cluster: Cluster, tmp_path: Path
) -> None:
    _, way_out = uninstall_blocks()
    operator = OperatorProcess(kube, cluster.namespace, tmp_path / "operator.log")
    try:
        create_finalized(cluster)
        eventually("the pool's StatefulSet", lambda: cluster.children("lake") or None)
    finally:
        operator.stop()
    for kind in ("envpool/lake", "trainingrun/train"):
        kube.kubectl("delete", "-n", cluster.namespace, kind, "--wait=false")
    pool = cluster.get("lake")
    assert pool is not None
    assert "deletionTimestamp" in pool["metadata"]  # held by the operator's finalizer
    run_shell(kube, way_out)
    eventually("the pool deleted", lambda: gone(cluster, "envpools", "lake"))
    eventually("the run deleted", lambda: gone(cluster, "trainingruns", "train"))
    eventually(
        "the pool's children garbage-collected",
        lambda: True if not cluster.children("lake") else None,
    )
