"""E2B's SDK against replgate's own client, on the same gateway in the same run.

Two figures: ``Sandbox.create`` + the first ``run_code("1+1")`` (a new session each time, from
the warm pool), and ``run_code("1+1")`` alone on an open sandbox, interleaved. The E2B path's
cost is what its SDK and the E2B translation add (``/e2b`` routes, NDJSON, token check); the
client's HTTP ``execute`` is beside it, since E2B's ``run_code`` is one HTTP request per call
where replgate's client keeps a WebSocket open.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from e2b_code_interpreter import AsyncSandbox as E2BSandbox

from bench._measure import interleaved, summary
from bench._peers import Replgate
from gateway.client import AsyncSandbox

ONE_PLUS_ONE = "1+1"


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


async def e2b_vs_client(replgate: Replgate, starts: int, round_trips: int) -> dict[str, Any]:
    point_e2b_at(replgate)
    first: dict[str, list[float]] = {"e2b_sdk": [], "replgate_client": []}
    for _ in range(starts):  # alternating, each from a refilled warm pool
        for name in first:
            await replgate.wait_idle(2)
            await asyncio.sleep(0.2)  # the refill's Docker calls are over
            first[name].append(await _e2b_start() if name == "e2b_sdk"
                               else await _replgate_start(replgate))

    e2b = await E2BSandbox.create()
    own = await AsyncSandbox.create(base_url=replgate.url, api_key=replgate.key)
    try:
        times = await interleaved({
            "e2b_sdk": lambda: e2b.run_code(ONE_PLUS_ONE),
            "replgate_client": lambda: own.run_code(ONE_PLUS_ONE),
            "replgate_client_http": lambda: own.execute_http(ONE_PLUS_ONE),
        }, round_trips)
    finally:
        await e2b.kill()
        await own.close()
    runs = {name: summary(values) for name, values in times.items()}
    return {"create_and_first_run": {name: summary(v) for name, v in first.items()},
            "run_code": runs,
            "run_code_added_p50_ms": runs["e2b_sdk"]["p50"] - runs["replgate_client"]["p50"]}
