"""Measuring: percentiles, interleaved timing, CPU and memory meters, the machine's description."""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import random
import subprocess
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import psutil

Action = Callable[[], Awaitable[Any]]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values_ms: list[float]) -> dict[str, float]:
    """p50, p95, mean (milliseconds) and n."""
    return {"p50": pct(values_ms, 0.5), "p95": pct(values_ms, 0.95),
            "mean": sum(values_ms) / len(values_ms), "n": len(values_ms)}


async def timed(n: int, action: Action) -> list[float]:
    """Run ``action`` n times in a row; each duration in milliseconds."""
    out = []
    for _ in range(n):
        start = time.perf_counter()
        await action()
        out.append((time.perf_counter() - start) * 1000)
    return out


async def interleaved(actions: dict[str, Action], n: int, warmup: int = 20,
                      rounds: int = 10, *, block: int | None = None,
                      around: Callable[[str], contextlib.AbstractContextManager[None]]
                      = lambda _name: contextlib.nullcontext()) -> dict[str, list[float]]:
    """Time each action ``n`` times, in ``rounds`` alternating blocks (or blocks of
    ``block`` calls); each block runs inside ``around(name)`` (to meter it, say).

    On a machine whose load changes during the run, each contender sees the same mix of quiet
    and busy moments, so their ratios hold even when the absolute figures drift. The order
    changes from round to round (the same every run): what one contender leaves running when
    its block ends (a batch of spans exporting, writes finishing) falls on a different one
    each time, not always on the one after it.
    """
    for action in actions.values():
        await timed(warmup, action)
    out: dict[str, list[float]] = {name: [] for name in actions}
    size = block or max(1, n // rounds)
    order = list(actions)
    shuffle = random.Random(0).shuffle
    while any(len(values) < n for values in out.values()):
        shuffle(order)
        for name in order:
            action = actions[name]
            with around(name):
                out[name] += await timed(min(size, n - len(out[name])), action)
    return out


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (threads included)."""
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def threads_cpu_s(pid: int) -> float:
    """CPU seconds of a process's threads, to the nanosecond (``/proc``'s schedstat; psutil's
    counts whole clock ticks, 10 ms, too coarse for a block of calls). A thread that ended
    takes its share with it: the gateway's threads (loop, workers, ZMQ) live on."""
    total = 0
    for task in os.scandir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"{task.path}/schedstat") as stat:
            total += int(stat.read().split()[0])
    return total / 1e9


def uss_bytes(pids: list[int]) -> int:
    """Unique set size: the memory that ending these processes would give back."""
    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(pid).memory_full_info().uss
    return total


def load_average() -> float:
    return os.getloadavg()[0]


async def wait_quiet(threshold: float, max_wait_s: float, log: Callable[[str], None]) -> float:
    """Wait (up to ``max_wait_s``) for the 1-minute load average to fall below ``threshold``."""
    deadline = time.monotonic() + max_wait_s
    load = load_average()
    while load >= threshold and time.monotonic() < deadline:
        log(f"waiting for a quiet machine: load {load:.2f} >= {threshold}")
        await asyncio.sleep(15)
        load = load_average()
    return load


def machine() -> dict[str, Any]:
    def docker_version() -> str:
        try:
            return subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"],
                                  capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return "unknown"

    cpu_model = ""
    try:
        with open("/proc/cpuinfo") as info:
            cpu_model = next((line.split(":", 1)[1].strip() for line in info
                              if line.startswith("model name")), "")
    except OSError:
        pass
    return {"date": datetime.now(UTC).isoformat(timespec="seconds"),
            "host": platform.node(), "cpus": os.cpu_count(), "cpu_model": cpu_model,
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "kernel": platform.release(), "python": platform.python_version(),
            "docker": docker_version(), "load_average_at_start": os.getloadavg()}
