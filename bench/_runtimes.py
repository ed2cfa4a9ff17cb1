"""runc against gVisor, side by side in one run: what the stronger wall costs.

Two gateways per runtime, alike but for ``REPLGATE_RUNTIME``: one with a warm pool (warm
session start, ``1+1``, a PNG, a file-heavy cell, memory per warm kernel) and one without
(cold start: container, and under gVisor its kernel, then the Jupyter kernel). The runtimes
alternate within each repetition, so a busy moment of the machine costs both alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench._figures import CHART_CODE, ONE_PLUS_ONE, Sizes
from bench._measure import summary
from bench._peers import Replgate

RUNTIMES = ("runc", "gvisor")
FILES_CODE = ("import os, uuid\nfolder = 'files-' + uuid.uuid4().hex\nos.mkdir(folder)\n"
              "for i in range(3000):\n    with open(f'{folder}/{i}.txt', 'w') as f:\n"
              "        f.write('x')")
"""3,000 small files written in the workspace: where gVisor costs most (every file operation
crosses to its file proxy, the gofer)."""
CLEAN_CODE = "import shutil, glob\nfor d in glob.glob('files-*'):\n    shutil.rmtree(d)"


async def _time(action: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await action()
    return (time.perf_counter() - start) * 1000


async def _session_start(rg: Replgate) -> float:
    """Milliseconds to create a session (then deleted, untimed)."""
    start = time.perf_counter()
    sid = await rg.create_session()
    elapsed = (time.perf_counter() - start) * 1000
    await rg.delete_session(sid)
    return elapsed


async def _executed(rg: Replgate, sid: str, code: str) -> None:
    result = await rg.http_execute(sid, code)
    if result["status"] != "ok":
        raise RuntimeError(f"{code!r} ended {result['status']}: {result.get('error')}")


async def runtimes(sizes: Sizes, log: Callable[[str], None]) -> dict[str, Any]:
    """Every figure for each runtime: ``{figure: {runtime: summary}}`` plus memory."""
    async with contextlib.AsyncExitStack() as stack:
        warm: dict[str, Replgate] = {}
        cold: dict[str, Replgate] = {}
        for runtime in RUNTIMES:
            warm[runtime] = Replgate(min_idle=2, max_kernels=6, runtime=runtime)
            stack.push_async_callback(warm[runtime].stop)
            cold[runtime] = Replgate(min_idle=0, max_kernels=2, runtime=runtime)
            stack.push_async_callback(cold[runtime].stop)
        await asyncio.gather(*(rg.wait_idle(2) for rg in warm.values()))
        timings: dict[str, dict[str, list[float]]] = {
            name: {r: [] for r in RUNTIMES}
            for name in ("warm_start", "one_plus_one", "png", "files", "cold_start")}

        log("runtimes: warm session start")
        for _ in range(sizes.starts_warm):
            for runtime, rg in warm.items():
                await rg.wait_idle(2)
                await asyncio.sleep(0.2)  # the refill's Docker calls are over
                timings["warm_start"][runtime].append(await _session_start(rg))

        sessions = {r: await rg.create_session() for r, rg in warm.items()}
        for runtime, rg in warm.items():  # the first execution of a kernel is not the figure
            await _executed(rg, sessions[runtime], ONE_PLUS_ONE)
        for name, code, n in (("one_plus_one", ONE_PLUS_ONE, sizes.round_trips),
                              ("png", CHART_CODE, sizes.charts),
                              ("files", FILES_CODE, max(3, sizes.charts // 4))):
            log(f"runtimes: {name}")
            for _ in range(n):
                for runtime, rg in warm.items():
                    timings[name][runtime].append(await _time(
                        lambda rg=rg, sid=sessions[runtime], code=code: _executed(rg, sid, code)))
            if name == "files":
                for runtime, rg in warm.items():
                    await _executed(rg, sessions[runtime], CLEAN_CODE)

        log("runtimes: memory per warm kernel")
        await asyncio.gather(*(rg.wait_idle(2) for rg in warm.values()))
        await asyncio.sleep(5)  # settled
        memory = {}
        for runtime, rg in warm.items():
            charges = [(reader.read().memory_bytes or 0) / 2**20
                       for reader, _ in await asyncio.to_thread(rg.sandboxes)]
            memory[runtime] = round(sorted(charges)[len(charges) // 2], 1) if charges else None

        log("runtimes: cold session start")
        for _ in range(sizes.starts_cold):
            for runtime, rg in cold.items():
                timings["cold_start"][runtime].append(await _session_start(rg))
    results: dict[str, Any] = {name: {r: summary(v) for r, v in by_runtime.items()}
                               for name, by_runtime in timings.items()}
    results["memory_per_warm_kernel_mib"] = memory
    return results
