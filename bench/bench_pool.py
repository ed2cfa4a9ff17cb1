"""The kernel pool against its baselines, measured in one run on this machine.

    .venv/bin/python bench/bench_pool.py [--acquisitions 20] [--executions 200]

Figures:
- warm acquire: taking a kernel from the warm pool (a hand-off), against a cold start (a
  container and a kernel started on demand) measured in the same run;
- execute round trip of ``1+1`` on a sandboxed kernel (request to ``done``), against the floor:
  jupyter_client driving a stock ipykernel started directly on the host.

Prints a table (p50/p95 and each figure's ratio to its baseline) and writes it to
bench/results/pool.json. Targets are reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager

from kernel_pool import KernelPool, PoolSettings, Profile

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values: list[float]) -> dict[str, float]:
    return {"p50_ms": pct(values, 0.5) * 1000, "p95_ms": pct(values, 0.95) * 1000,
            "mean_ms": statistics.fmean(values) * 1000, "n": len(values)}


async def timed(n: int, action: Callable[[], Awaitable[Any]]) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        await action()
        out.append(time.perf_counter() - start)
    return out


def settings(state_dir: Path, min_idle: int) -> PoolSettings:
    return PoolSettings(
        state_dir=state_dir, owner=f"bench-{secrets.token_hex(4)}", max_kernels=4,
        profiles={"default": Profile(min_idle=min_idle, workspace_size="256m")})


async def bench_acquire(state_dir: Path, acquisitions: int, cold_starts: int,
                        ) -> dict[str, Any]:
    """Warm hand-offs (the pool refilled between each) and cold starts, in one pool each."""
    warm: list[float] = []
    pool = KernelPool(settings(state_dir / "warm", min_idle=1))
    try:
        await pool.start()
        for _ in range(acquisitions):
            await pool.wait_ready(timeout_s=120)
            start = time.perf_counter()
            kernel = await pool.acquire()
            warm.append(time.perf_counter() - start)
            await pool.release(kernel)
    finally:
        await pool.close()
    cold: list[float] = []
    pool = KernelPool(settings(state_dir / "cold", min_idle=0))
    try:
        await pool.start()
        for _ in range(cold_starts):
            start = time.perf_counter()
            kernel = await pool.acquire()
            cold.append(time.perf_counter() - start)
            await pool.release(kernel)
    finally:
        await pool.close()
    return {"warm": summary(warm), "cold": summary(cold)}


async def bench_execute_pool(state_dir: Path, executions: int) -> dict[str, float]:
    pool = KernelPool(settings(state_dir / "exec", min_idle=1))
    try:
        await pool.start()
        await pool.wait_ready(timeout_s=120)
        session = await pool.create_session()

        async def one() -> None:
            result = await session.execute("1+1")
            assert result.status == "ok" and result.outputs[0].data["text/plain"] == "2"

        await timed(10, one)  # warm-up
        return summary(await timed(executions, one))
    finally:
        await pool.close()


async def bench_execute_floor(state_dir: Path, executions: int) -> dict[str, float]:
    """jupyter_client and a stock ipykernel on the host: no container, no caps, no routing.

    Over the same ZMQ transport as the pool's kernels (ipc)."""
    manager = AsyncKernelManager(kernel_name="python3", transport="ipc",
                                 ip=str(state_dir / "floor"))
    await manager.start_kernel()
    client = manager.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        async def one() -> None:
            reply = await client.execute_interactive("1+1", output_hook=lambda _msg: None,
                                                     timeout=30)
            assert reply["content"]["status"] == "ok"

        await timed(10, one)
        return summary(await timed(executions, one))
    finally:
        client.stop_channels()
        await manager.shutdown_kernel(now=True)


def row(name: str, figure: dict[str, float], baseline: dict[str, float] | None) -> str:
    ratio = "-"
    if baseline:
        value = figure["p50_ms"] / baseline["p50_ms"]
        ratio = f"{value:.2f}x" if value >= 0.01 else f"1/{1 / value:,.0f}"
    return (f"{name:<38} {figure['p50_ms']:>10.2f} {figure['p95_ms']:>10.2f} {ratio:>12}"
            f" {figure['n']:>6.0f}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--acquisitions", type=int, default=20)
    parser.add_argument("--cold-starts", type=int, default=5)
    parser.add_argument("--executions", type=int, default=200)
    args = parser.parse_args()

    state_dir = Path(tempfile.mkdtemp(prefix="rg-bench-", dir="/tmp"))
    try:
        acquire = await bench_acquire(state_dir, args.acquisitions, args.cold_starts)
        execute = await bench_execute_pool(state_dir, args.executions)
        floor = await bench_execute_floor(state_dir, args.executions)
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)

    print(f"{'figure (ms)':<38} {'p50':>10} {'p95':>10} {'p50 ratio':>12} {'n':>6}")
    print(row("cold start (container + kernel)", acquire["cold"], None))
    print(row("warm acquire (vs cold start)", acquire["warm"], acquire["cold"]))
    print(row("execute 1+1, stock ipykernel (floor)", floor, None))
    print(row("execute 1+1, sandboxed (vs floor)", execute, floor))

    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {
        "when": datetime.now(UTC).isoformat(), "host": platform.node(),
        "python": platform.python_version(), "cpus": os.cpu_count(),
        "cold_start": acquire["cold"], "warm_acquire": acquire["warm"],
        "warm_acquire_ratio_to_cold": acquire["warm"]["p50_ms"] / acquire["cold"]["p50_ms"],
        "execute_floor": floor, "execute_pool": execute,
        "execute_ratio_to_floor": execute["p50_ms"] / floor["p50_ms"],
    }
    (RESULTS / "pool.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {RESULTS / 'pool.json'}")


if __name__ == "__main__":
    asyncio.run(main())
