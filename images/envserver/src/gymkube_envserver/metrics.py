"""Prometheus metrics: request counts and latencies by endpoint and error code, plus load gauges."""

from __future__ import annotations

import time
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gymkube_envserver.canary import Canary
from gymkube_envserver.env_pool import EnvRetired
from gymkube_envserver.openenv_wire import HTTP_PATHS
from gymkube_envserver.sessions import SessionManager

ENDPOINTS = frozenset(
    {
        "/",
        "/create",
        "/reset",
        "/step",
        "/close",
        "/observation",
        "/detail",
        "/tasks",
        "/healthz",
        "/readyz",
        "/status",
        "/metrics",
        "/admin/drain",
        *HTTP_PATHS,  # OpenEnv's
    }
)
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class LoadCollector(Collector):
    """Reads the session manager and canary at scrape time."""

    def __init__(self, manager: SessionManager, canary: Canary) -> None:
        self.manager = manager
        self.canary = canary

    def collect(self) -> Iterable[Metric]:
        manager = self.manager
        gauges = {
            "active_sessions": ("Open sessions, with those being created.", manager.active),
            "capacity_sessions": ("Most open sessions accepted.", manager.settings.max_sessions),
            "warm_envs": ("Idle started envs waiting for /create.", len(manager.warm)),
            "draining": ("1 while the server takes no new sessions.", int(manager.draining)),
            "ready": ("1 when /readyz answers 200.", int(manager.ready)),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(f"gymkube_envserver_{name}", doc, value=value)
        yield CounterMetricFamily(
            "gymkube_envserver_sessions_served", "Sessions created.", value=manager.served
        )
        yield CounterMetricFamily(
            "gymkube_envserver_envs_started",
            "Envs started (for ScienceWorld, JVMs).",
            value=manager.envs_started,
        )
        yield CounterMetricFamily(
            "gymkube_envserver_envs_reused",
            "Sessions that got an env an earlier session had given back.",
            value=manager.envs_reused,
        )
        retired = CounterMetricFamily(
            "gymkube_envserver_envs_retired",
            "Envs closed instead of going back to the pool, by reason.",
            labels=["reason"],
        )
        for reason in EnvRetired:
            retired.add_metric([reason.value], manager.envs_retired[reason])
        yield retired
        yield CounterMetricFamily(
            "gymkube_envserver_episodes",
            "Episodes that ended (reset again or closed); canary episodes are not counted.",
            value=manager.episodes_played,
        )
        yield CounterMetricFamily(
            "gymkube_envserver_episode_score",
            "Sum of the last score of every ended episode, in the env's own scale.",
            value=manager.episode_score_sum,
        )
        yield CounterMetricFamily(
            "gymkube_envserver_replays",
            "Resets a client marked as replays: lost episodes rebuilt on this server.",
            value=manager.replays,
        )
        status = self.canary.status
        if status.ok is not None:
            yield GaugeMetricFamily(
                "gymkube_envserver_canary_ok",
                "1 when the last canary passed.",
                value=int(status.ok),
            )
            yield GaugeMetricFamily(
                "gymkube_envserver_canary_latency_seconds",
                "Duration of the last canary episode.",
                value=(status.latency_ms or 0.0) / 1000,
            )


class ServerMetrics:
    def __init__(self, manager: SessionManager, canary: Canary) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "gymkube_envserver_requests",
            "Requests by endpoint and error code ('ok' for success).",
            ["endpoint", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "gymkube_envserver_request_duration_seconds",
            "Request latency by endpoint.",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(LoadCollector(manager, canary))

    def observe(self, endpoint: str, code: str, seconds: float) -> None:
        self.requests.labels(endpoint, code).inc()
        self.latency.labels(endpoint).observe(seconds)


class MetricsMiddleware:
    """Plain ASGI (no per-request task) so it costs microseconds on the step path."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        status = 500

        async def send_and_watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            path = scope["path"]
            endpoint = path if path in ENDPOINTS else "other"
            code = scope.get("state", {}).get("error_code") or ("ok" if status < 400 else "http")
            self.metrics.observe(endpoint, str(code), time.perf_counter() - began)
