"""Prometheus figures: aggregate only (no tenant, no code), served without auth at /metrics."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kernel_pool import Execution, SessionHost


class _PoolCollector(Collector):
    def __init__(self, pool: SessionHost) -> None:
        self._pool = pool

    def collect(self) -> Iterator[Metric]:
        stats = self._pool.stats()
        kernels = GaugeMetricFamily("replgate_pool_kernels", "Kernels by state", labels=["state"])
        for state in ("idle", "starting", "in_use"):
            kernels.add_metric([state], stats[state])
        yield kernels
        yield GaugeMetricFamily("replgate_sessions", "Live sessions", value=stats["sessions"])
        yield GaugeMetricFamily("replgate_sessions_paused", "Sessions paused to disk",
                                value=stats["paused"])
        yield GaugeMetricFamily("replgate_pool_max_kernels", "Kernel cap", value=stats["max"])


class Metrics:
    """The gateway's own registry (not the process-global one), so apps never collide."""

    def __init__(self, pool: SessionHost) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_PoolCollector(pool))
        self.executions = Counter("replgate_executions", "Executions by final status",
                                  ["status"], registry=self.registry)
        self.duration = Histogram(
            "replgate_execution_duration_seconds", "Execution wall time",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=self.registry)
        self.truncations = Counter("replgate_truncations", "Executions whose output was capped",
                                   registry=self.registry)
        self.restarts = Counter("replgate_kernel_restarts", "Kernels restarted (timeout, death)",
                                registry=self.registry)
        self.acquire = Histogram(
            "replgate_session_acquire_seconds", "Time to hand a kernel to a new session",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1, 2.5, 5, 10),
            registry=self.registry)

    def observe(self, execution: Execution) -> None:
        self.executions.labels(execution.status.value).inc()
        self.duration.observe(execution.duration_ms / 1000)
        if execution.truncated:
            self.truncations.inc()
        if execution.restarted:
            self.restarts.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
