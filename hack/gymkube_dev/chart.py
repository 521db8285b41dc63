"""The operator's Helm chart, installed and uninstalled through pyhelm3 (`make up`, `make down`
and the e2e suite), and the wait for the operator it runs."""

import asyncio
import hashlib
import logging
import time
from pathlib import Path
from typing import Any

import yaml
from pyhelm3 import Client as HelmClient

from gymkube_dev import CHART
from gymkube_dev.console import duration, poll, say
from gymkube_dev.kube import Kube, api_path
from gymkube_dev.objects import current, pod_state
from gymkube_dev.settings import FIELD_MANAGER
from gymkube_dev.tools import find_tool

# pyhelm3 logs every non-zero helm exit as a warning, the `helm status` it runs to learn that a
# first install has no release yet included; a real failure raises, and the caller reports it.
logging.getLogger("pyhelm3.command").setLevel(logging.ERROR)
Values = dict[str, Any]


def helm(kube: Kube) -> HelmClient:
    return HelmClient(executable=find_tool("helm"), kubeconfig=kube.kubeconfig)


def release_selector(release: str) -> str:
    return f"app.kubernetes.io/instance={release}"


def chart_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in CHART.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(CHART)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def up_values(operator_image_id: str) -> Values:
    """Default images are the chart's (gymkube/<name>:<appVersion>, IfNotPresent), which is what
    was loaded. The annotations roll the operator when its image or the chart changed."""
    return {
        "podAnnotations": {
            "gymkube.io/operator-image": operator_image_id,
            "gymkube.io/chart": chart_digest(),
        }
    }


def apply_crds(kube: Kube) -> list[str]:
    """Helm installs crds/ only on first install and never upgrades them: applying them first
    makes a changed CRD take effect on the next install too. Returns their names."""
    names = []
    for path in sorted((CHART / "crds").glob("*.yaml")):
        for crd in filter(None, yaml.safe_load_all(path.read_text())):
            kube.apply(crd, field_manager=FIELD_MANAGER)
            names.append(str(crd["metadata"]["name"]))
    return names


def install(
    kube: Kube,
    release: str,
    namespace: str,
    values: Values,
    *,
    wait: bool = False,
    chart_dir: Path = CHART,
) -> int:
    """Installs or upgrades the release (a no-op when nothing changed); returns its revision."""
    client = helm(kube)

    async def ensure() -> int:
        chart = await client.get_chart(str(chart_dir))
        revision = await client.ensure_release(
            release,
            chart,
            values,
            namespace=namespace,
            create_namespace=True,
            wait=wait,
            timeout="5m",
        )
        return int(revision.revision)

    return asyncio.run(ensure())


def current_values(kube: Kube, release: str, namespace: str) -> Values:
    """The values the release's current revision was installed with (as `helm get values`)."""
    client = helm(kube)

    async def read() -> Values:
        revision = await client.get_current_revision(release, namespace=namespace)
        return dict(await revision.values())

    return asyncio.run(read())


def merged_values(base: Values, extra: Values) -> Values:
    """BASE with EXTRA laid over it, nested maps merged key by key (as helm merges -f files)."""
    merged = dict(base)
    for key, value in extra.items():
        nested = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = merged_values(merged[key], value) if nested else value
    return merged


def uninstall(kube: Kube, release: str, namespace: str, *, wait: bool = True) -> bool:
    """Uninstalls the release; False when it was not installed."""
    client = helm(kube)

    async def remove() -> bool:
        releases = await client.list_releases(namespace=namespace, all=True)
        if release not in {found.name for found in releases}:
            return False
        await client.uninstall_release(release, namespace=namespace, wait=wait, timeout="3m")
        return True

    return asyncio.run(remove())


def install_for_up(kube: Kube, release: str, namespace: str, operator_image_id: str) -> None:
    crds = apply_crds(kube)
    say(f"CRDs applied: {', '.join(crds)}")
    started = time.monotonic()
    revision = install(kube, release, namespace, up_values(operator_image_id))
    say(
        f"release {release} in {namespace}: revision {revision} "
        f"({duration(time.monotonic() - started)})"
    )


def wait_operator(
    kube: Kube, release: str, namespace: str, timeout: float, interval: float
) -> None:
    selector = release_selector(release)

    def check() -> tuple[bool, str]:
        deployments = kube.list_objects(api_path("apps/v1", "deployments", namespace), selector)
        if not deployments:
            return False, "no operator Deployment yet"
        dep = deployments[0]
        status, want = dep.get("status") or {}, dep["spec"].get("replicas", 1)
        done = current(dep) and all(
            status.get(key, 0) == want
            for key in ("replicas", "updatedReplicas", "availableReplicas")
        )
        pods = kube.list_objects(api_path("v1", "pods", namespace), selector)
        available = f"deployment/{dep['metadata']['name']}: {status.get('availableReplicas', 0)}"
        return done, f"{available}/{want} available; " + "; ".join(map(pod_state, pods))

    poll("operator", check, timeout, interval)
