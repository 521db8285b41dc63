"""One diagnostics dump for a failed `make up` and a failed e2e test: the gymkube objects,
workloads, events, pod descriptions, the logs of the operator and of the pools' routers and env
servers, and the nodes, as kubectl shows them."""

import subprocess
import sys

from gymkube_operator.kinds import GROUP
from gymkube_operator.labels import COMPONENT_LABEL

from gymkube_dev.chart import release_selector
from gymkube_dev.kube import Kube
from gymkube_dev.settings import cache_dir


def sections(namespace: str, operator_namespace: str, release: str) -> dict[str, list[str]]:
    """Title -> kubectl arguments, in the order a reader wants them."""
    ns, ops = namespace, operator_namespace
    operator_logs = ["logs", "-n", ops, "-l", release_selector(release)]
    return {
        f"gymkube objects in {ns}": [
            "get", f"envpools.{GROUP},trainingruns.{GROUP}", "-n", ns, "-o", "yaml",
        ],
        f"workloads in {ns}": ["get", "all,pdb,configmaps", "-n", ns, "-o", "wide"],
        f"events in {ns}": ["get", "events", "-n", ns, "--sort-by=.lastTimestamp"],
        f"events in {ops}": ["get", "events", "-n", ops, "--sort-by=.lastTimestamp"],
        f"pods in {ns}": ["describe", "pods", "-n", ns],
        f"operator pods in {ops}": ["describe", "pods", "-n", ops],
        "operator logs": [*operator_logs, "--all-containers", "--prefix", "--tail=300"],
        "operator logs (previous container)": [
            *operator_logs, "--all-containers", "--prefix", "--previous", "--tail=100",
        ],
        # Where a session or an episode went: the routers place and replay them.
        f"router and env server logs in {ns}": [
            "logs", "-n", ns, "-l", f"{COMPONENT_LABEL} in (router,envserver)", "--all-containers",
            "--prefix", "--tail=300", "--max-log-requests=20",
        ],
        "nodes": ["describe", "nodes"],
    }  # fmt: skip


def dump(kube: Kube, namespace: str, operator_namespace: str, release: str) -> str:
    parts = []
    for title, args in sections(namespace, operator_namespace, release).items():
        try:
            text = kube.kubectl(*args, check=False, timeout=60, with_stderr=True)
        except subprocess.TimeoutExpired:
            text = "(kubectl timed out)\n"
        parts.append(f"===== {title} =====\n{text}")
    return "\n".join(parts)


def print_and_save(text: str) -> None:
    """To stderr, and to $GYMKUBE_CACHE/up/diagnostics.txt for later."""
    cache_dir().mkdir(parents=True, exist_ok=True)
    path = cache_dir() / "diagnostics.txt"
    path.write_text(text)
    print(text, file=sys.stderr)
    print(f"\n(diagnostics saved to {path})", file=sys.stderr)
