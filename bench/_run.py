"""One run: start the contenders, measure every figure, print the table, write the JSON."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench import _figures as figures
from bench import _runtimes
from bench._bursts import bursts, cluster_bursts
from bench._e2b import e2b_vs_client
from bench._lifecycle import held, lifecycle, pause_with
from bench._measure import load_average, machine, wait_quiet
from bench._peers import Floor, KernelGateway, Replgate
from bench._report import table, targets
from bench._sizes import pause_sizes
from bench.cycles import cycles
from bench.templates import templates

RESULTS = Path(__file__).resolve().parent / "results"
FIGURES = ("session_start", "round_trip", "cpu", "streaming", "chart", "flood", "lifecycle",
           "throughput", "density", "runtimes", "e2b", "bursts")
BOOTED = {"REPLGATE_KERNEL_TEMPLATES": "false"}
"""A gateway whose kernels all boot: the baseline of the cold starts from a template."""
ON_REQUEST = ("held", "pause_with", "pause_sizes", "cycles", "bursts_cluster", "templates")
"""Figures run only when named in ``--only`` (``held`` reserves disk for hundreds of
workspaces; ``pause_with`` needs the engine's checkpoint: experimental mode and CRIU;
``pause_sizes`` holds gigabytes of memory and writes them to disk; ``cycles``: a hundred
pause/resume cycles on one session, memory pauses among them; ``bursts_cluster`` needs the
PostgreSQL of ``REPLGATE_TEST_POSTGRES``; ``templates`` builds a custom template twice)."""


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


GROUPS = (frozenset({"runtimes"}), frozenset({"e2b"}), frozenset({"cycles"}),
          frozenset({"templates"}), frozenset({"bursts", "bursts_cluster"}),
          frozenset({"lifecycle", "held", "pause_with", "pause_sizes"}))
"""Figures measured on gateways of their own when ``--only`` names nothing else: the on-request
ones are measured only that way (a mix runs each group of them in turn, after the others)."""


def parts(wanted: set[str]) -> list[set[str]]:
    """The runs one invocation makes for the figures ``wanted``, in order: all of them in one
    when they fit one group of :data:`GROUPS` (or none is on request), else the figures the
    contenders share first, then each group's on-request figures."""
    if any(wanted <= group for group in GROUPS):
        return [wanted]
    shared = wanted - set(ON_REQUEST)
    asked = [set(wanted & group & set(ON_REQUEST)) for group in GROUPS]
    return [part for part in (shared, *asked) if part]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    wanted = set(args.only.split(",")) if args.only else set(FIGURES)
    sizes = figures.Sizes.make(args.quick)
    if args.sessions:
        sizes.throughput_sessions = tuple(int(n) for n in args.sessions.split(","))
    results: dict[str, Any] = {"machine": machine(), "quick": args.quick}
    if args.wait_quiet:
        results["machine"]["load_average_when_started"] = await wait_quiet(
            args.quiet_load, args.quiet_wait_s, log)
    started = time.monotonic()
    Replgate.image = results["machine"]["sandbox_image"] = await asyncio.to_thread(
        figures.sandbox_image, log)
    for part in parts(wanted):
        await _measure_part(part, sizes, args, results)
    return _finish(results, started)


async def _measure_part(wanted: set[str], sizes: figures.Sizes, args: argparse.Namespace,
                        results: dict[str, Any]) -> None:
    """Measure the figures ``wanted`` (one of :func:`parts`) into ``results``."""
    if wanted == {"runtimes"}:  # runc against gVisor alone: none of the other contenders
        results["runtimes"] = await _runtimes.runtimes(sizes, log)
        return
    if wanted == {"e2b"}:  # E2B's SDK and replgate's client on one gateway: nothing else
        await _e2b_only(sizes, results)
        return
    if wanted == {"cycles"}:  # pause/resume cycles and a fork chain on one gateway of its own
        count = 20 if args.quick else args.cycles
        log(f"{count} pause/resume cycles, a chain of {args.fork_chain} forks")
        await _loaded(results, "cycles", "cycles", cycles(count, args.fork_chain, log))
        return
    if wanted == {"templates"}:  # custom templates' builds and starts, two gateways of its own
        await _loaded(results, "custom templates", "templates", templates(args.quick, log))
        for line in results["templates"]["verdicts"]:
            log(line)
        return
    if wanted <= {"bursts", "bursts_cluster"}:  # ours at a default install's pool, alone
        if "bursts" in wanted:
            await _loaded(results, "bursts", "bursts", bursts(args.quick, args.burst_warm, log))
        if "bursts_cluster" in wanted:
            await _loaded(results, "bursts, cluster", "bursts_cluster", cluster_bursts(log))
        return
    if wanted <= {"lifecycle", "held", "pause_with", "pause_sizes"}:  # ours alone, no others
        await _lifecycle_only(wanted, sizes, args, results)
        return
    stack = contextlib.AsyncExitStack()
    async with stack:
        log(f"starting the contenders (sandbox image {Replgate.image})")
        replgate = Replgate(min_idle=2, max_kernels=40)
        stack.push_async_callback(replgate.stop)
        cold = Replgate(min_idle=0, max_kernels=4)
        stack.push_async_callback(cold.stop)
        cold_boot = Replgate(min_idle=0, max_kernels=4, settings=BOOTED)
        stack.push_async_callback(cold_boot.stop)
        kernel_gateway, kg_nodelay = KernelGateway(), KernelGateway(nodelay=True)
        stack.push_async_callback(kernel_gateway.stop)
        stack.push_async_callback(kg_nodelay.stop)
        floor = await Floor.start()
        stack.push_async_callback(floor.stop)
        pool = await figures.in_process_pool(Replgate.image)
        stack.push_async_callback(pool.close)
        await asyncio.gather(replgate.wait_idle(2), kernel_gateway.wait(), kg_nodelay.wait(),
                             replgate.wait_template(), cold.wait_template(),
                             cold_boot.wait_idle(0))
        session = await replgate.create_session()
        contenders = figures.Contenders(
            replgate=replgate, session=session, socket=await replgate.connect(session),
            floor=floor, kernel_gateway=kernel_gateway,
            kg_kernel=await kernel_gateway.start_kernel(), kg_nodelay=kg_nodelay,
            kg_nodelay_kernel=await kg_nodelay.start_kernel(), pool=pool,
            pool_session=await pool.create_session())
        for kernel in (contenders.kg_kernel, contenders.kg_nodelay_kernel):
            await kernel.execute("%matplotlib inline")
        await floor.execute("%matplotlib inline")

        loads: dict[str, list[float]] = results.setdefault("load_average_1min", {})

        async def measure(name: str, key: str, figure: Awaitable[Any]) -> None:
            log(name)
            before = load_average()
            try:
                results[key] = await figure
            except Exception as exc:  # one figure failing leaves the others standing
                log(f"{name} failed: {exc!r}\n" + "".join(traceback.format_exc(limit=-6)))
                results[key] = {"error": repr(exc)}
            loads[name] = [round(before, 2), round(load_average(), 2)]  # before, after

        steps: list[tuple[str, str, Callable[[], Awaitable[Any]]]] = [
            ("session_start", "session start",
             lambda: figures.session_start(contenders, cold, cold_boot, sizes)),
            ("round_trip", "execute round trip (interleaved)",
             lambda: figures.round_trip(contenders, sizes)),
            ("cpu", "CPU per execution", lambda: figures.cpu_per_execution(contenders, sizes)),
            ("streaming", "streaming", lambda: figures.streaming(contenders, sizes)),
            ("chart", "matplotlib PNG", lambda: figures.chart(contenders, sizes)),
            ("flood", "flood", lambda: figures.flood(contenders)),
            ("lifecycle", "pause, resume, fork",
             lambda: lifecycle(replgate, cold, cold_boot, sizes.starts_cold)),
            ("e2b", "E2B SDK against replgate's client",
             lambda: e2b_vs_client(replgate, sizes.starts_warm, sizes.round_trips)),
        ]
        keys = {"cpu": "cpu_per_execution"}
        for key, name, figure in steps:
            if key in wanted:
                await measure(name, keys.get(key, key), figure())
        await contenders.socket.close()
        if "throughput" in wanted:
            results["throughput"] = {}
            for n in sizes.throughput_sessions:
                await measure(f"throughput, {n} sessions", "_throughput",
                              figures.throughput(contenders, n, sizes.throughput_s))
                results["throughput"][str(n)] = results.pop("_throughput")
        if "density" in wanted:
            await measure("density", "density", figures.density(contenders, sizes))
        if "runtimes" in wanted:
            await measure("runc against gVisor", "runtimes", _runtimes.runtimes(sizes, log))
        if "bursts" in wanted:  # its own gateways (the others idle meanwhile)
            await measure("bursts", "bursts", bursts(args.quick, args.burst_warm, log))
        log("stopping the contenders")


async def _loaded(results: dict[str, Any], name: str, key: str, figure: Awaitable[Any]) -> None:
    """``results[key]`` from ``figure``, with the 1-minute load before and after it."""
    before = load_average()
    results[key] = await figure
    results.setdefault("load_average_1min", {})[name] = [round(before, 2),
                                                         round(load_average(), 2)]


async def _e2b_only(sizes: figures.Sizes, results: dict[str, Any]) -> None:
    name = "E2B SDK against replgate's client"
    log(name)
    replgate = Replgate(min_idle=2, max_kernels=40)
    try:
        await replgate.wait_idle(2)
        await _loaded(results, name, "e2b",
                      e2b_vs_client(replgate, sizes.starts_warm, sizes.round_trips))
    finally:
        await replgate.stop()


async def _lifecycle_only(wanted: set[str], sizes: figures.Sizes, args: argparse.Namespace,
                          results: dict[str, Any]) -> None:
    if "lifecycle" in wanted:
        log("pause, resume, fork")
        async with contextlib.AsyncExitStack() as stack:
            replgate = Replgate(min_idle=args.lifecycle_warm, max_kernels=40)
            stack.push_async_callback(replgate.stop)
            cold = Replgate(min_idle=0, max_kernels=4)
            stack.push_async_callback(cold.stop)
            cold_boot = Replgate(min_idle=0, max_kernels=4, settings=BOOTED)
            stack.push_async_callback(cold_boot.stop)
            await asyncio.gather(replgate.wait_template(), cold.wait_template(),
                                 cold_boot.wait_idle(0))
            await replgate.wait_idle(args.lifecycle_warm)
            await _loaded(results, "pause, resume, fork", "lifecycle",
                          lifecycle(replgate, cold, cold_boot, sizes.starts_cold,
                                    args.lifecycle_warm))
    if "pause_with" in wanted:
        log("pause with variables against pause with memory")
        async with contextlib.AsyncExitStack() as stack:
            variables = Replgate(min_idle=1, max_kernels=8,
                                 settings={"REPLGATE_PAUSE_WITH": "variables"})
            stack.push_async_callback(variables.stop)
            memory = Replgate(min_idle=1, max_kernels=8,
                              settings={"REPLGATE_PAUSE_WITH": "memory"})
            stack.push_async_callback(memory.stop)
            await asyncio.gather(variables.wait_idle(1), memory.wait_idle(1))
            await _loaded(results, "pause with variables against pause with memory",
                          "pause_with", pause_with(variables, memory, sizes.starts_cold))
    if "pause_sizes" in wanted:
        log("pause and resume at 200 MiB and 1 GiB, against the disk")
        sizes_mib = tuple(int(mib) for mib in args.pause_sizes.split(","))
        results["pause_sizes"] = await pause_sizes(sizes_mib, memory_pause=not args.no_memory_pause)
        log(json.dumps(results["pause_sizes"], indent=2))
        for line in results["pause_sizes"]["verdicts"]:
            log(line)
    if "held" in wanted:
        log(f"{args.held_sessions} paused sessions held")
        results["held"] = await held(args.held_sessions, args.held_sample)


def _finish(results: dict[str, Any], started: float) -> dict[str, Any]:
    results["machine"]["load_average_at_end"] = os.getloadavg()
    results["machine"]["load_average_1min_at_end"] = load_average()
    results["seconds"] = round(time.monotonic() - started)
    results["targets"] = targets(results)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench",
                                     description="replgate against the floor and Kernel Gateway")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, 1 and 8 sessions")
    parser.add_argument("--only", help="comma-separated figures of "
                        f"{', '.join(FIGURES + ON_REQUEST)}")
    parser.add_argument("--lifecycle-warm", type=int, default=2,
                        help="warm kernels the gateway of --only lifecycle keeps (the full "
                        "run's keeps 2)")
    parser.add_argument("--held-sessions", type=int, default=200,
                        help="paused sessions the held figure makes")
    parser.add_argument("--held-sample", type=int, default=8,
                        help="held sessions resumed (spread over the lot)")
    parser.add_argument("--pause-sizes", default="200,1024",
                        help="MiB the pauses of --only pause_sizes hold, e.g. 200")
    parser.add_argument("--no-memory-pause", action="store_true",
                        help="--only pause_sizes without its memory pauses")
    parser.add_argument("--cycles", type=int, default=100,
                        help="pause/resume cycles of --only cycles (--quick: 20)")
    parser.add_argument("--fork-chain", type=int, default=10,
                        help="forks of forks of --only cycles")
    parser.add_argument("--sessions", help="throughput session counts, e.g. 1,8,32")
    parser.add_argument("--burst-warm", type=int, default=None,
                        help="warm kernels of the bursts' gateway (default: a default "
                        "install's, REPLGATE_MIN_IDLE)")
    parser.add_argument("--wait-quiet", action="store_true",
                        help="first wait for the load average to drop (see --quiet-load)")
    parser.add_argument("--quiet-load", type=float, default=1.5)
    parser.add_argument("--quiet-wait-s", type=float, default=600)
    parser.add_argument("--output", type=Path, default=RESULTS / "latest.json")
    args = parser.parse_args()
    unknown = set(args.only.split(",")) - set(FIGURES + ON_REQUEST) if args.only else set()
    if unknown:
        parser.error(f"--only names no figure {', '.join(sorted(unknown))}")
    results = asyncio.run(run(args))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    print(f"\nwritten to {args.output}")
