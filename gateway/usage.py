"""A session's resource use now (``GET /v1/sessions/{id}/metrics``, E2B's ``getMetrics``).

The sandbox's cgroup counts CPU time as a running total, so a percentage needs two readings
some time apart: each request's reading is kept for :data:`WINDOW_S`, and the figure covers the
time since the oldest kept one. A first request (or one after a quiet spell) has none at
least :data:`MIN_WINDOW_S` old, and waits that long for a second reading: no sampler runs in the
background for sessions nobody watches. So the figures over a time range (E2B's
``getMetrics(start, end)``) are those of the requests made in it: each reading is kept, the
last :data:`HISTORY` of each session, until the session ends or the gateway stops.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from datetime import UTC, datetime

from gateway.wire import SessionMetricsOut
from kernel_pool import SandboxUsage, SessionPort

WINDOW_S = 5.0
"""The CPU figure covers at most the last this many seconds."""
MIN_WINDOW_S = 1.0
"""... and at least this many: a shorter span is mostly the reading's own noise."""
HISTORY = 720
"""Readings kept per session (an hour's at E2B's one every 5 s)."""


class UsageMeter:
    """Recent CPU readings and the last figures of each session that was asked about."""

    def __init__(self) -> None:
        self._readings: dict[str, deque[tuple[float, int]]] = {}
        self._last: dict[str, SessionMetricsOut] = {}
        self._history: dict[str, deque[tuple[float, SessionMetricsOut]]] = {}

    async def read(self, session: SessionPort) -> SessionMetricsOut:
        """The session's figures now; a paused one's last figures with memory and CPU 0. Each
        answer is kept for :meth:`history`."""
        figures = await self._read(session)
        kept = self._history.setdefault(session.id, deque(maxlen=HISTORY))
        kept.append((datetime.fromisoformat(figures.at).timestamp(), figures))
        return figures

    def history(self, session_id: str, start: float | None = None,
                until: float | None = None) -> list[SessionMetricsOut]:
        """The session's kept readings taken at ``start`` or later and before ``until`` (Unix
        seconds; None: open), oldest first."""
        return [figures for at, figures in self._history.get(session_id, ())
                if (start is None or at >= start) and (until is None or at < until)]

    async def _read(self, session: SessionPort) -> SessionMetricsOut:
        usage = await session.usage()
        at = datetime.now(UTC).isoformat()
        if usage.paused:
            last = self._last.get(session.id)
            disk = last.disk_used_bytes if last is not None else usage.disk_used_bytes
            return SessionMetricsOut(
                cpu_used_pct=0.0, mem_used_bytes=0, mem_limit_bytes=usage.memory_limit_bytes,
                disk_used_bytes=disk, disk_limit_bytes=usage.disk_limit_bytes, at=at)
        if usage.cpu_ns is None:  # a backend that cannot read it: memory and disk only
            return self._keep(session.id, 0.0, usage, at)
        readings = self._readings.setdefault(session.id, deque())
        now, cpu_ns = time.monotonic(), usage.cpu_ns
        while readings and (now - readings[0][0] > WINDOW_S or readings[0][1] > cpu_ns):
            readings.popleft()  # too old, or another sandbox's (a resume starts one afresh)
        readings.append((now, cpu_ns))
        since, cpu_before = readings[0]
        if now - since < MIN_WINDOW_S:
            await asyncio.sleep(MIN_WINDOW_S - (now - since))
            usage = await session.usage()
            now, at = time.monotonic(), datetime.now(UTC).isoformat()
            if usage.cpu_ns is None or usage.cpu_ns < cpu_before:  # paused or moved meanwhile
                return await self._read(session)
            cpu_ns = usage.cpu_ns
            readings.append((now, cpu_ns))
        percent = 100.0 * (cpu_ns - cpu_before) / 1e9 / ((now - since) * usage.cpus)
        return self._keep(session.id, percent, usage, at)

    def _keep(self, session_id: str, percent: float, usage: SandboxUsage,
              at: str) -> SessionMetricsOut:
        figures = SessionMetricsOut(
            cpu_used_pct=round(min(max(percent, 0.0), 100.0), 1),
            mem_used_bytes=usage.memory_bytes, mem_limit_bytes=usage.memory_limit_bytes,
            disk_used_bytes=usage.disk_used_bytes, disk_limit_bytes=usage.disk_limit_bytes,
            at=at)
        self._last[session_id] = figures
        return figures

    def forget(self, session_id: str) -> None:
        """The session is gone."""
        self._readings.pop(session_id, None)
        self._last.pop(session_id, None)
        self._history.pop(session_id, None)
