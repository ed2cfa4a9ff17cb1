"""Each figure of the benchmark: what is timed, against which baseline, on which contenders."""

from __future__ import annotations

import asyncio
import os
import secrets
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import psutil

from bench._measure import interleaved, process_cpu_s, summary, timed, uss_bytes
from bench._peers import Floor, KernelGateway, KernelGatewayKernel, Replgate, ReplgateSocket
from kernel_pool import KernelPool, PoolSettings, Profile
from kernel_pool.backends.docker import build_image

ONE_PLUS_ONE = "1+1"
STREAM_CODE = ("import time\nfor _ in range({n}):\n"
               "    print(time.time(), flush=True); time.sleep(0.05)")
CHART_CODE = "import matplotlib.pyplot as plt\nplt.figure(); plt.plot([1, 3, 2]); plt.show()"
THROUGHPUT_ROUNDS = 4
"""Alternating rounds of the floor and replgate within one throughput phase."""
FLOOD_CODE = "for _ in range(100):\n    print('x' * 1_000_000)"


@dataclass
class Sizes:
    """Repetitions; ``quick`` shrinks them all."""

    round_trips: int
    starts_warm: int
    starts_cold: int
    charts: int
    stream_prints: int
    throughput_s: float
    throughput_sessions: tuple[int, ...]
    density_kernels: int
    cpu_executions: int

    @classmethod
    def make(cls, quick: bool) -> Sizes:
        if quick:
            return cls(round_trips=60, starts_warm=8, starts_cold=3, charts=10,
                       stream_prints=20, throughput_s=3.0, throughput_sessions=(1, 8),
                       density_kernels=3, cpu_executions=100)
        return cls(round_trips=400, starts_warm=30, starts_cold=6, charts=40,
                   stream_prints=40, throughput_s=10.0, throughput_sessions=(1, 8, 32),
                   density_kernels=6, cpu_executions=400)


@dataclass
class Contenders:
    """The long-lived contenders of one run (each throughput phase starts its own kernels)."""

    replgate: Replgate
    session: str
    socket: ReplgateSocket
    floor: Floor
    kernel_gateway: KernelGateway
    kg_kernel: KernelGatewayKernel
    kg_nodelay: KernelGateway
    kg_nodelay_kernel: KernelGatewayKernel
    pool: KernelPool
    pool_session: Any


def sandbox_image(log: Callable[[str], None]) -> str:
    """The sandbox image of this checkout, built if needed: the tag ``latest`` may be another
    checkout's (the tests of a parallel branch build it too)."""
    client = docker.from_env()
    try:
        state = Path(tempfile.mkdtemp(prefix="rg-bench-image-", dir="/tmp"))
        return build_image(client, state_dir=state, log=log).tag
    finally:
        client.close()


async def in_process_pool(image: str) -> KernelPool:
    """kernel_pool on its own, in this process: the pool's share of replgate's figures."""
    state = Path(tempfile.mkdtemp(prefix="rg-bench-pool-", dir="/tmp"))
    pool = KernelPool(PoolSettings(
        state_dir=state, owner=f"bench-{secrets.token_hex(4)}", max_kernels=3,
        profiles={"default": Profile(image=image, min_idle=1, workspace_size="256m")}))
    await pool.start()
    await pool.wait_ready(timeout_s=300)
    return pool


# -- 1. session start -------------------------------------------------------------------------


async def session_start(c: Contenders, cold: Replgate, cold_boot: Replgate,
                        sizes: Sizes) -> dict[str, Any]:
    warm = []
    for _ in range(sizes.starts_warm):
        await c.replgate.wait_idle(2)
        await asyncio.sleep(0.2)  # the refill's Docker calls are over
        start = time.perf_counter()
        sid = await c.replgate.create_session()
        warm.append((time.perf_counter() - start) * 1000)
        await c.replgate.delete_session(sid)

    acquire = []
    for _ in range(sizes.starts_warm):
        await c.pool.wait_ready(timeout_s=300)
        await asyncio.sleep(0.2)
        start = time.perf_counter()
        kernel = await c.pool.acquire()
        acquire.append((time.perf_counter() - start) * 1000)
        await c.pool.release(kernel)

    cold_starts, boot_starts = [], []
    for _ in range(sizes.starts_cold):  # interleaved: both see the same machine
        for gateway, starts in ((cold, cold_starts), (cold_boot, boot_starts)):
            start = time.perf_counter()
            sid = await gateway.create_session()
            starts.append((time.perf_counter() - start) * 1000)
            await gateway.delete_session(sid)

    kg_starts = []
    for _ in range(sizes.starts_cold):
        start = time.perf_counter()
        kernel = await c.kernel_gateway.start_kernel()
        kg_starts.append((time.perf_counter() - start) * 1000)
        await kernel.close()
    return {"replgate_warm": summary(warm), "pool_acquire_in_process": summary(acquire),
            "replgate_cold": summary(cold_starts), "replgate_cold_boot": summary(boot_starts),
            "kernel_gateway": summary(kg_starts)}


# -- 2. execute round trip --------------------------------------------------------------------


async def round_trip(c: Contenders, sizes: Sizes) -> dict[str, Any]:
    rg, sid = c.replgate, c.session

    async def pool() -> None:
        result = await c.pool_session.execute(ONE_PLUS_ONE)
        assert result.outputs[0].data["text/plain"] == "2"

    times = await interleaved({
        "floor": lambda: c.floor.execute(ONE_PLUS_ONE),
        "pool_in_process": pool,
        "replgate_ws": lambda: c.socket.execute(ONE_PLUS_ONE),
        "replgate_http": lambda: rg.http_execute(sid, ONE_PLUS_ONE),
        "kernel_gateway_ws": lambda: c.kg_kernel.execute(ONE_PLUS_ONE),
        "kernel_gateway_ws_nodelay": lambda: c.kg_nodelay_kernel.execute(ONE_PLUS_ONE),
    }, sizes.round_trips)
    return {name: summary(values) for name, values in times.items()}


async def cpu_per_execution(c: Contenders, sizes: Sizes) -> dict[str, Any]:
    """CPU milliseconds one ``1+1`` costs each process involved (kernel, server, client)."""
    me = os.getpid()
    n = sizes.cpu_executions
    out: dict[str, Any] = {}

    async def measure(run: Callable[[], Awaitable[Any]], kernel: Callable[[], float],
                      server: Callable[[], float] | None) -> dict[str, float]:
        await timed(20, run)
        before = (kernel(), server() if server else 0.0, process_cpu_s(me))
        await timed(n, run)
        after = (kernel(), server() if server else 0.0, process_cpu_s(me))
        kernel_ms, server_ms, client_ms = ((b - a) * 1000 / n for a, b in zip(before, after,
                                                                              strict=True))
        return {"kernel_ms": kernel_ms, "server_ms": server_ms, "client_ms": client_ms}

    out["floor"] = await measure(lambda: c.floor.execute(ONE_PLUS_ONE),
                                 lambda: process_cpu_s(c.floor.pid), None)
    out["replgate_ws"] = await measure(lambda: c.socket.execute(ONE_PLUS_ONE),
                                       c.replgate.sandbox_cpu_s,
                                       lambda: process_cpu_s(c.replgate.pid))
    kg = psutil.Process(c.kernel_gateway.pid)

    def kg_kernels() -> float:
        return sum(process_cpu_s(child.pid) for child in kg.children(recursive=True))

    out["kernel_gateway_ws"] = await measure(lambda: c.kg_kernel.execute(ONE_PLUS_ONE),
                                             kg_kernels,
                                             lambda: process_cpu_s(c.kernel_gateway.pid))
    return out


# -- 3. streaming -----------------------------------------------------------------------------


async def streaming(c: Contenders, sizes: Sizes) -> dict[str, Any]:
    """From a ``print`` in the kernel to its text at the client, while the cell runs on."""
    code = STREAM_CODE.format(n=sizes.stream_prints)

    def lags_of(texts: list[tuple[float, str]]) -> list[float]:
        return [(arrived - float(word)) * 1000 for arrived, text in texts
                for word in text.split()]

    async def replgate() -> list[float]:
        texts: list[tuple[float, str]] = []
        await c.socket.execute(code, lambda f: texts.append((time.time(), f["text"]))
                               if f["type"] == "stdout" else None)
        return lags_of(texts)

    async def floor() -> list[float]:
        texts: list[tuple[float, str]] = []
        await c.floor.execute(code, lambda m: texts.append((time.time(), m["content"]["text"]))
                              if m["msg_type"] == "stream" else None)
        return lags_of(texts)

    async def kernel_gateway() -> list[float]:
        texts: list[tuple[float, str]] = []
        await c.kg_nodelay_kernel.execute(
            code, lambda m: texts.append((time.time(), m["content"]["text"]))
            if m["msg_type"] == "stream" else None)
        return lags_of(texts)

    out = {"floor": await floor(), "replgate_ws": await replgate(),
           "kernel_gateway_ws_nodelay": await kernel_gateway()}
    return {name: summary(values) for name, values in out.items()}


# -- 4. a chart -------------------------------------------------------------------------------


async def chart(c: Contenders, sizes: Sizes) -> dict[str, Any]:
    async def replgate() -> None:
        frames = await c.socket.execute(CHART_CODE)
        assert any("image/png" in f.get("data", {}) for f in frames), frames

    async def floor() -> None:
        images: list[str] = []
        await c.floor.execute(CHART_CODE, lambda m: images.extend(
            m["content"].get("data", {}).keys() if m["msg_type"] == "display_data" else []))
        assert "image/png" in images

    async def kernel_gateway() -> None:
        frames = await c.kg_nodelay_kernel.execute(CHART_CODE)
        assert any("image/png" in f["content"].get("data", {}) for f in frames)

    times = await interleaved({"floor": floor, "replgate_ws": replgate,
                               "kernel_gateway_ws_nodelay": kernel_gateway},
                              sizes.charts, warmup=3, rounds=5)
    return {name: summary(values) for name, values in times.items()}


# -- 5. throughput ----------------------------------------------------------------------------


async def _drive(runners: list[Callable[[], Awaitable[Any]]], seconds: float,
                 cpu: dict[str, Callable[[], float]]) -> dict[str, Any]:
    """Each runner executes ``1+1`` in a loop; executions per second, and CPU use (cores)."""
    for run in runners:
        await run()
    count = 0
    meters = {"client": lambda: process_cpu_s(os.getpid()), **cpu}
    before = {name: meter() for name, meter in meters.items()}
    start = time.perf_counter()
    end = start + seconds

    async def loop(run: Callable[[], Awaitable[Any]]) -> None:
        nonlocal count
        while time.perf_counter() < end:
            await run()
            count += 1

    await asyncio.gather(*(loop(run) for run in runners))
    elapsed = time.perf_counter() - start
    used = {f"{name}_cores": round((meter() - before[name]) / elapsed, 2)
            for name, meter in meters.items()}
    return {"per_s": count / elapsed, **used}


async def throughput(c: Contenders, sessions: int, seconds: float) -> dict[str, Any]:
    """The floor and replgate alternate in rounds (each holding its kernels meanwhile), so a
    load change during the phase hits both alike; Kernel Gateway follows, alone."""
    out: dict[str, Any] = {}
    rg = c.replgate
    floors = await asyncio.gather(*(Floor.start() for _ in range(sessions)))
    sids: list[str] = []
    sockets: list[ReplgateSocket] = []
    try:
        for first in range(0, sessions, 8):  # cold starts beyond the warm ones, 8 at a time
            sids += await asyncio.gather(*(rg.create_session()
                                           for _ in range(min(8, sessions - first))))
        sockets = [await rg.connect(sid) for sid in sids]
        contenders: dict[str, tuple[list[Callable[[], Awaitable[Any]]],
                                    dict[str, Callable[[], float]]]] = {
            "floor": ([lambda f=f: f.execute(ONE_PLUS_ONE) for f in floors],
                      {"kernels": lambda: sum(process_cpu_s(f.pid) for f in floors)}),
            "replgate_ws": ([lambda s=s: s.execute(ONE_PLUS_ONE) for s in sockets],
                            {"kernels": rg.sandbox_cpu_s,
                             "server": lambda: process_cpu_s(rg.pid)}),
        }
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
        for _ in range(THROUGHPUT_ROUNDS):
            for name, (runners, cpu) in contenders.items():
                rounds[name].append(await _drive(runners, seconds / THROUGHPUT_ROUNDS, cpu))
        for name, measured in rounds.items():  # rounds of equal length: their mean
            out[name] = {key: round(statistics.fmean(m[key] for m in measured), 2)
                         for key in measured[0]}
    finally:
        for socket in sockets:
            await socket.close()
        await asyncio.gather(*(rg.delete_session(sid) for sid in sids))
        await asyncio.gather(*(f.stop() for f in floors))

    for name, kg in (("kernel_gateway_ws", c.kernel_gateway),
                     ("kernel_gateway_ws_nodelay", c.kg_nodelay)):
        kernels = [await kg.start_kernel() for _ in range(sessions)]
        kg_process = psutil.Process(kg.pid)
        try:
            out[name] = await _drive(
                [lambda k=k: k.execute(ONE_PLUS_ONE) for k in kernels], seconds,
                {"kernels": lambda p=kg_process: sum(process_cpu_s(child.pid)
                                                     for child in p.children(recursive=True)),
                 "server": lambda p=kg_process: process_cpu_s(p.pid)})
        finally:
            await asyncio.gather(*(k.close() for k in kernels))
    return out


# -- 6. density -------------------------------------------------------------------------------


async def density(c: Contenders, sizes: Sizes) -> dict[str, Any]:
    """Memory of idle warm kernels (pre-imports included), from a gateway of only warm ones."""
    available_before = psutil.virtual_memory().available
    n = sizes.density_kernels
    rg = Replgate(min_idle=n, max_kernels=n)
    try:
        await rg.wait_idle(n)
        await asyncio.sleep(5)  # settled
        sandboxes = await asyncio.to_thread(rg.sandboxes)
        per_uss = [uss_bytes(pids) / 2**20 for _, pids in sandboxes]
        per_cgroup = [(reader.read().memory_bytes or 0) / 2**20 for reader, _ in sandboxes]
        gateway_rss = psutil.Process(rg.pid).memory_info().rss
        host_delta = (available_before - psutil.virtual_memory().available - gateway_rss) / n
    finally:
        await rg.stop()
    floor_uss = uss_bytes([c.floor.pid]) / 2**20
    per_kernel = sorted(per_uss)[len(per_uss) // 2]
    return {"kernels": len(per_uss), "uss_mib": per_kernel,
            "cgroup_charge_mib": sorted(per_cgroup)[len(per_cgroup) // 2],
            "host_available_drop_mib": host_delta / 2**20,
            "floor_kernel_uss_mib": floor_uss,
            "fit_in_available_memory": int(available_before / 2**20 // per_kernel),
            "memory_available_gib": round(available_before / 2**30, 1)}


# -- 7. flood ---------------------------------------------------------------------------------


async def flood(c: Contenders) -> dict[str, Any]:
    """The gateway's peak RSS while one session prints 100 MB."""
    gateway = psutil.Process(c.replgate.pid)
    before = gateway.memory_info().rss
    peak = before
    start = time.perf_counter()
    task = asyncio.create_task(c.socket.execute(FLOOD_CODE))
    while not task.done():
        peak = max(peak, gateway.memory_info().rss)
        await asyncio.sleep(0.01)
    frames = task.result()
    done = frames[-1]
    return {"before_mib": before / 2**20, "peak_mib": peak / 2**20,
            "seconds": time.perf_counter() - start, "status": done["status"],
            "truncated": done.get("truncated"),
            "characters_received": sum(len(f.get("text", "")) for f in frames)}
