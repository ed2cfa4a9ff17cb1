"""E2B's SDK against replgate's own client, on the same gateway in the same run.

Two figures: ``Sandbox.create`` + the first ``run_code("1+1")`` (a new session each time, from
the warm pool), and ``run_code("1+1")`` alone, interleaved in blocks of a few calls, every
client on the SAME session (the E2B SDK connects to the sandbox replgate's client created):
one kernel, one warm state, so the kernel's share of a round trip is the same for each and
what differs is the path. The E2B path's cost is what its SDK and the E2B translation add
(``/e2b`` routes, NDJSON, token check); the client's HTTP ``execute`` is beside it, since E2B's
``run_code`` is one HTTP request per call where replgate's client keeps a WebSocket open.

Beside the latencies, the CPU each contender costs per call: the client's (this process, all
its threads, ``time.process_time``: E2B's SDK runs its HTTP stack on a thread of its own) and
the gateway's (its process, measured around each block), which say how much of the added
latency is the SDK's own work, which replgate cannot change, and how much is the gateway's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from e2b_code_interpreter import AsyncSandbox as E2BSandbox

from bench._measure import interleaved, summary, threads_cpu_s
from bench._peers import Replgate
from gateway.client import AsyncSandbox

ONE_PLUS_ONE = "1+1"
BLOCK = 10
"""Calls per contender before the next one's turn: short blocks, so a change of load in
the run falls on every contender alike."""


def point_e2b_at(replgate: Replgate) -> None:
    """The three variables a user sets (the SDK reads them at each call)."""
    os.environ.update({"E2B_API_URL": f"{replgate.url}/e2b",
                       "E2B_SANDBOX_URL": f"{replgate.url}/e2b/sandbox",
                       "E2B_API_KEY": replgate.key})


async def _e2b_start() -> float:
    start = time.perf_counter()
    sandbox = await E2BSandbox.create()
    execution = await sandbox.run_code(ONE_PLUS_ONE)
    elapsed = (time.perf_counter() - start) * 1000
    assert execution.text == "2", execution
    await sandbox.kill()
    return elapsed


async def _replgate_start(replgate: Replgate) -> float:
    start = time.perf_counter()
    sandbox = await AsyncSandbox.create(base_url=replgate.url, api_key=replgate.key)
    execution = await sandbox.run_code(ONE_PLUS_ONE)
    elapsed = (time.perf_counter() - start) * 1000
    assert execution.outputs[0].data["text/plain"] == "2", execution
    await sandbox.close()
    return elapsed


async def _metered(replgate: Replgate, actions: dict[str, Callable[[], Awaitable[Any]]],
                   n: int) -> dict[str, dict[str, Any]]:
    """Each action ``n`` times in alternating blocks: latencies, and the client's and the
    gateway's CPU per call (milliseconds)."""
    client_s = dict.fromkeys(actions, 0.0)
    gateway_s = dict.fromkeys(actions, 0.0)

    @contextlib.contextmanager
    def metering(name: str) -> Iterator[None]:
        gateway, client = threads_cpu_s(replgate.pid), time.process_time()
        yield
        client_s[name] += time.process_time() - client
        gateway_s[name] += threads_cpu_s(replgate.pid) - gateway

    times = await interleaved(actions, n, block=BLOCK, around=metering)
    return {name: {**summary(values),
                   "client_cpu_ms": client_s[name] * 1000 / len(values),
                   "gateway_cpu_ms": gateway_s[name] * 1000 / len(values)}
            for name, values in times.items()}


async def e2b_vs_client(replgate: Replgate, starts: int, round_trips: int) -> dict[str, Any]:
    point_e2b_at(replgate)
    first: dict[str, list[float]] = {"e2b_sdk": [], "replgate_client": []}
    for _ in range(starts):  # alternating, each from a refilled warm pool
        for name in first:
            await replgate.wait_idle(2)
            await asyncio.sleep(0.2)  # the refill's Docker calls are over
            first[name].append(await _e2b_start() if name == "e2b_sdk"
                               else await _replgate_start(replgate))

    own = await AsyncSandbox.create(base_url=replgate.url, api_key=replgate.key)
    try:
        e2b = await E2BSandbox.connect(own.session_id)
        # The pool's refill after this session (Docker calls, a kernel starting) ends first:
        # it would fall on the first contender's calls.
        await replgate.wait_idle(2)
        await asyncio.sleep(0.2)
        runs = await _metered(replgate, {
            "e2b_sdk": lambda: e2b.run_code(ONE_PLUS_ONE),
            "replgate_client": lambda: own.run_code(ONE_PLUS_ONE),
            "replgate_client_http": lambda: own.execute_http(ONE_PLUS_ONE),
        }, round_trips)
    finally:
        await own.close()
    e2b_run, ws_run = runs["e2b_sdk"], runs["replgate_client"]
    return {"create_and_first_run": {name: summary(v) for name, v in first.items()},
            "run_code": runs,
            "run_code_added_p50_ms": e2b_run["p50"] - ws_run["p50"],
            "client_cpu_added_ms": e2b_run["client_cpu_ms"] - ws_run["client_cpu_ms"],
            "gateway_cpu_added_ms": e2b_run["gateway_cpu_ms"] - ws_run["gateway_cpu_ms"]}
