"""The operator's own Prometheus metrics, served as text at /metrics on settings.metrics_port.

One registry for the process: every reconcile pass (EnvPool, TrainingRun, EvalRun), every request
to the API server, every watchdog probe and restart counts here, and the pools' and runs' current
state is read from the last status each one wrote.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

REGISTRY = CollectorRegistry()

RECONCILES = Counter(
    "gymkube_operator_reconciles",
    "Reconcile passes, by resource kind and result (ok, api_error, error).",
    ["kind", "result"],
    registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "gymkube_operator_reconcile_duration_seconds",
    "How long one reconcile pass took, by resource kind.",
    ["kind"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
API_REQUESTS = Counter(
    "gymkube_operator_api_requests",
    "Requests to the Kubernetes API server, by method and HTTP status (error: no answer).",
    ["method", "code"],
    registry=REGISTRY,
)
PROBES = Counter(
    "gymkube_operator_watchdog_probes",
    "Watchdog reads of env servers' /status, by result (ok, or the failure: NoAnswer, ...).",
    ["result"],
    registry=REGISTRY,
)
POD_ACTIONS = Counter(
    "gymkube_operator_envserver_pods_replaced",
    "Env-server pods the watchdog deleted, by action (restart, recycle) and cause.",
    ["action", "reason"],
    registry=REGISTRY,
)


class _States(Collector):
    """Gauges of how many objects are in each state, from the last state each one reported."""

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...]) -> None:
        self._name, self._documentation, self._labels = name, documentation, labels
        self._states: dict[tuple[str, str, str], tuple[str, ...]] = {}
        REGISTRY.register(self)

    def set(self, kind: str, namespace: str, name: str, state: tuple[str, ...]) -> None:
        self._states[(kind, namespace, name)] = state

    def forget(self, kind: str, namespace: str, name: str) -> None:
        self._states.pop((kind, namespace, name), None)

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(self._name, self._documentation, labels=self._labels)
        counts = Tally((kind, *state) for (kind, _, _), state in self._states.items())
        for labels, count in sorted(counts.items()):
            family.add_metric(list(labels), count)
        yield family


POOLS = _States(
    "gymkube_operator_envpools",
    "EnvPools by Ready status and Degraded reason (Healthy when not degraded).",
    ("kind", "ready", "degraded"),
)
RUNS = _States(
    "gymkube_operator_runs",
    "TrainingRuns and EvalRuns by phase.",
    ("kind", "phase"),
)


class _RunProgress(Collector):
    """Each running TrainingRun's step, total steps and last mean reward, from its status."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str], tuple[float, float | None, float | None]] = {}
        REGISTRY.register(self)

    def set(
        self, namespace: str, name: str, step: float, total: float | None, reward: float | None
    ) -> None:
        self._runs[(namespace, name)] = (step, total, reward)

    def forget(self, namespace: str, name: str) -> None:
        self._runs.pop((namespace, name), None)

    def collect(self) -> Iterable[Metric]:
        labels = ["namespace", "trainingrun"]
        step = GaugeMetricFamily(
            "gymkube_operator_trainingrun_step",
            "The training step a run last finished.",
            labels=labels,
        )
        total = GaugeMetricFamily(
            "gymkube_operator_trainingrun_total_steps",
            "Steps the run trains in all.",
            labels=labels,
        )
        reward = GaugeMetricFamily(
            "gymkube_operator_trainingrun_mean_reward",
            "Mean reward of the run's last finished step.",
            labels=labels,
        )
        for key, (done, steps, mean) in sorted(self._runs.items()):
            step.add_metric(list(key), done)
            if steps is not None:
                total.add_metric(list(key), steps)
            if mean is not None:
                reward.add_metric(list(key), mean)
        yield from (step, total, reward)


RUN_PROGRESS = _RunProgress()


def count_pass(kind: str, result: str, seconds: float) -> None:
    """One reconcile pass of a KIND: ok, api_error (the API server refused or did not answer) or
    error (a bug), and how long it took."""
    RECONCILES.labels(kind, result).inc()
    RECONCILE_SECONDS.labels(kind).observe(seconds)


def api_request_trace() -> aiohttp.TraceConfig:
    """Counts every request of the session it is given to (the API client's), by method and
    status."""
    trace = aiohttp.TraceConfig()

    async def ended(_: object, __: object, done: aiohttp.TraceRequestEndParams) -> None:
        API_REQUESTS.labels(done.method, str(done.response.status)).inc()

    async def failed(_: object, __: object, done: aiohttp.TraceRequestExceptionParams) -> None:
        API_REQUESTS.labels(done.method, "error").inc()

    trace.on_request_end.append(ended)
    trace.on_request_exception.append(failed)
    return trace


async def _serve(_: web.Request) -> web.Response:
    return web.Response(body=generate_latest(REGISTRY), content_type="text/plain", charset="utf-8")


async def start_server(host: str, port: int) -> web.AppRunner:
    """Serve /metrics on HOST:PORT until the returned runner is cleaned up."""
    app = web.Application()
    app.router.add_get("/metrics", _serve)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
