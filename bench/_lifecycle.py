"""Session lifecycle figures: pause, resume on first use, fork, against starting afresh.

Every figure goes through the gateway's HTTP API, as a client sees it. The baselines, taken in
the same run: a cold session start plus ``1+1`` (what a client without pause pays to get a
kernel back, variables lost) and four sessions created at once (what a fork of four replaces).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from bench._measure import summary
from bench._peers import Replgate

DATA_STACK = ("import numpy as np, pandas as pd, matplotlib.pyplot as plt\n"
              "frame = pd.DataFrame({'x': np.arange(100_000), 'y': np.random.random(100_000)})\n"
              "total = float(frame.y.sum())")


async def _post(rg: Replgate, path: str, body: dict[str, Any] | None = None) -> Any:
    response = await rg.http.post(path, json=body or {})
    response.raise_for_status()
    return response.json()


async def lifecycle(rg: Replgate, cold: Replgate, repeats: int) -> dict[str, Any]:
    """pause p50 and snapshot size; resume + 1+1 p50 (vs cold start + 1+1); fork of 4."""
    pause, resume, sizes, cold_starts, forks, creates = [], [], [], [], [], []
    for _ in range(repeats):
        sid = await rg.create_session()
        await rg.http_execute(sid, DATA_STACK)
        start = time.perf_counter()
        paused = await _post(rg, f"/v1/sessions/{sid}/pause")
        pause.append((time.perf_counter() - start) * 1000)
        sizes.append(paused["snapshot_bytes"])
        start = time.perf_counter()
        result = await rg.http_execute(sid, "1+1")
        resume.append((time.perf_counter() - start) * 1000)
        assert result["status"] == "ok", result

        start = time.perf_counter()
        children = await _post(rg, f"/v1/sessions/{sid}/fork", {"count": 4})
        forks.append((time.perf_counter() - start) * 1000)
        for child in children:
            await rg.delete_session(child["id"])
        await rg.delete_session(sid)

        await rg.wait_idle(2)
        start = time.perf_counter()
        made = await asyncio.gather(*(rg.create_session() for _ in range(4)))
        creates.append((time.perf_counter() - start) * 1000)
        for other in made:
            await rg.delete_session(other)

        start = time.perf_counter()
        fresh = await cold.create_session()
        await cold.http_execute(fresh, "1+1")
        cold_starts.append((time.perf_counter() - start) * 1000)
        await cold.delete_session(fresh)
        await rg.wait_idle(2)
    return {"pause": summary(pause), "resume_execute": summary(resume),
            "cold_start_execute": summary(cold_starts), "fork4": summary(forks),
            "create4": summary(creates),
            "snapshot_mib": round(statistics.median(sizes) / 2**20, 2),
            "paused_with": "variables"}
