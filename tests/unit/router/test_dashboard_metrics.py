"""charts/gymkube/dashboards/gymkube.json asks only for metrics that exist: every metric its
queries name is one a real env server, a real router or the operator exposes."""

import json
import re
from pathlib import Path

import httpx
from gymkube_operator import metrics as operator_metrics
from prometheus_client import generate_latest
from router_harness import Procs, wait_all

DASHBOARD = Path(__file__).parents[3] / "charts" / "gymkube" / "dashboards" / "gymkube.json"
METRIC = re.compile(r"\bgymkube_[a-z_]+")
# What Prometheus adds to a family's name in its samples.
SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


def _families(exposition: str) -> set[str]:
    return {_family(name) for name in re.findall(r"^# TYPE (\S+) ", exposition, flags=re.M)}


def _family(sample: str) -> str:
    for suffix in SUFFIXES:
        if sample.endswith(suffix):
            return sample.removesuffix(suffix)
    return sample


def test_every_metric_the_dashboard_queries_is_exposed(procs: Procs) -> None:
    server = procs.env_server(max_sessions=4)
    router = procs.router_for([server])
    wait_all(server, router)
    exposed = _families(generate_latest(operator_metrics.REGISTRY).decode())
    for proc in (server, router):
        exposed |= _families(httpx.get(f"{proc.url}/metrics", timeout=10).text)

    dashboard = json.loads(DASHBOARD.read_text())
    queried = {
        _family(name)
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in METRIC.findall(target["expr"])
        if not name.startswith("gymkube_io_")  # the pool label, not a metric
    }
    assert queried, "the dashboard queries nothing"
    assert sorted(queried - exposed) == []
