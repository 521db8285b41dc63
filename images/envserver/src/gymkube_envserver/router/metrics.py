"""Prometheus metrics of the router.

The hot path only bumps plain ints (prometheus_client's own metric objects take a lock per
update); a collector turns them into metric families at scrape time.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gymkube_envserver.router.pool import Pool
from gymkube_envserver.router.tunnel import Tunnel

ADDED_LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.1,
    1.0,
)


class Histogram:
    """Bucket counts of one series; ``observe`` is a bisect and two adds."""

    __slots__ = ("buckets", "count", "sum")

    def __init__(self) -> None:
        self.buckets = [0] * (len(ADDED_LATENCY_BUCKETS) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.buckets[bisect_left(ADDED_LATENCY_BUCKETS, value)] += 1
        self.count += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, float]]:
        running = 0
        out: list[tuple[str, float]] = []
        for bound, count in zip((*ADDED_LATENCY_BUCKETS, float("inf")), self.buckets, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), running))
        return out


class RouterMetrics(Collector):
    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self.requests: Counter[tuple[str, int]] = Counter()
        self.added_latency: dict[str, Histogram] = {}
        self.create_waits = 0
        self.pool_full = 0
        self.orphans_closed = 0
        self.tunnels_opened = 0
        self.tunnel_messages = 0
        self.tunnel_closes: Counter[int] = Counter()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def observe(self, endpoint: str, status: int, added_seconds: float) -> None:
        self.requests[endpoint, status] += 1
        histogram = self.added_latency.get(endpoint)
        if histogram is None:
            histogram = self.added_latency[endpoint] = Histogram()
        histogram.observe(added_seconds)

    def tunnel_closed(self, tunnel: Tunnel) -> None:
        self.tunnel_messages += tunnel.messages
        self.tunnel_closes[int(tunnel.closed_with or 0)] += 1

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "gymkube_router_requests",
            "Requests answered by the router, by endpoint and HTTP status.",
            labels=["endpoint", "code"],
        )
        for (endpoint, status), count in sorted(self.requests.items()):
            requests.add_metric([endpoint, str(status)], count)
        yield requests

        added = HistogramMetricFamily(
            "gymkube_router_added_latency_seconds",
            "Time a request spent in the router itself (handler time minus backend time).",
            labels=["endpoint"],
        )
        for endpoint, histogram in sorted(self.added_latency.items()):
            added.add_metric([endpoint], histogram.cumulative(), histogram.sum)
        yield added

        yield CounterMetricFamily(
            "gymkube_router_create_waits",
            "Creates that waited for room in a full pool.",
            value=self.create_waits,
        )
        yield GaugeMetricFamily(
            "gymkube_router_creates_waiting",
            "Creates held right now for room in a full pool, or for a server in one scaling up.",
            value=self._pool.waiting,
        )
        yield CounterMetricFamily(
            "gymkube_router_pool_full",
            "Creates refused with 503 because the pool stayed full for --create-wait.",
            value=self.pool_full,
        )
        yield CounterMetricFamily(
            "gymkube_router_orphans_closed",
            "Sessions closed because their client left while /create was under way.",
            value=self.orphans_closed,
        )
        yield CounterMetricFamily(
            "gymkube_router_websockets_opened",
            "OpenEnv WebSocket sessions placed and tunnelled to a backend.",
            value=self.tunnels_opened,
        )
        closes = CounterMetricFamily(
            "gymkube_router_websockets_closed",
            "Tunnelled WebSockets that ended, by the close code the client got "
            "(1000 normal, 1001 router shutdown, 4408 expired, 4410 backend lost).",
            labels=["code"],
        )
        for code, count in sorted(self.tunnel_closes.items()):
            closes.add_metric([str(code)], count)
        yield closes
        yield CounterMetricFamily(
            "gymkube_router_websocket_messages",
            "Frames relayed by tunnels that have ended, both directions.",
            value=self.tunnel_messages,
        )
        yield from self._backend_families()

    def _backend_families(self) -> Iterator[Metric]:
        backends = list(self._pool.backends.values())
        labels = ["backend"]
        up = GaugeMetricFamily(
            "gymkube_router_backend_up", "1 when the backend answers its polls.", labels=labels
        )
        ready = GaugeMetricFamily(
            "gymkube_router_backend_ready",
            "1 when the backend takes new sessions.",
            labels=labels,
        )
        capacity = GaugeMetricFamily(
            "gymkube_router_backend_capacity", "Session slots reported.", labels=labels
        )
        active = GaugeMetricFamily(
            "gymkube_router_backend_active", "Open sessions reported.", labels=labels
        )
        placed = CounterMetricFamily(
            "gymkube_router_sessions_placed",
            "Sessions this replica created on the backend.",
            labels=labels,
        )
        lost = CounterMetricFamily(
            "gymkube_router_sessions_lost",
            "Requests answered 410 because the backend was gone.",
            labels=labels,
        )
        tunnels = GaugeMetricFamily(
            "gymkube_router_backend_websockets",
            "WebSockets this replica tunnels to the backend now.",
            labels=labels,
        )
        errors = CounterMetricFamily(
            "gymkube_router_backend_errors",
            "Backend calls that failed at the connection level.",
            labels=labels,
        )
        for backend in backends:
            label = [backend.address]
            up.add_metric(label, 0 if backend.dead or backend.status is None else 1)
            ready.add_metric(label, 1 if backend.placeable else 0)
            capacity.add_metric(label, backend.status.capacity if backend.status else 0)
            active.add_metric(label, backend.status.active if backend.status else 0)
            placed.add_metric(label, backend.placed)
            lost.add_metric(label, backend.lost)
            errors.add_metric(label, backend.errors)
            tunnels.add_metric(label, len(backend.tunnels))
        yield from (up, ready, capacity, active, placed, lost, errors, tunnels)
