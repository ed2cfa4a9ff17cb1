"""Pause and resume at real sizes (issue 26): sessions holding 200 MiB and 1 GiB of variables,
and a memory pause of a 200 MiB session, side by side with what the machine's own disk does
with the same bytes in the same run, and the gateway's memory over the whole sweep.

The baseline writes the bytes to the state directory's file system in 1 MiB pieces and
fsyncs them (what a pause must do before it answers), then reads them back with their pages
dropped from the cache first (what a resume after a while reads). The variables are random
floats (what compresses least: the worst case for the stream's zstd) and a 1,000,000-row
numeric DataFrame.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from bench._peers import Replgate

MiB = 1 << 20
SIZES_MIB = (200, 1024)
ROUNDS = 3
"""Pauses and resumes per size: the figures are their medians."""
FRAME_MIB = 16
"""The DataFrame's share of each size (two float64 columns of 1,000,000 rows)."""


def _holding(mib: int) -> str:
    """Code that makes a session hold ``mib`` MiB of variables."""
    floats = (mib - FRAME_MIB) * MiB // 8
    return ("import numpy as np, pandas as pd\n"
            f"data = np.random.default_rng(1).random({floats})\n"
            "frame = pd.DataFrame({'x': np.arange(1_000_000, dtype=np.float64),"
            " 'y': np.linspace(0, 1, 1_000_000)})\n"
            "check = float(data[::4096].sum())")


def disk_baseline(folder: Path, size: int) -> dict[str, float]:
    """Seconds to write ``size`` bytes to ``folder``'s file system (fsync'd) and read them
    back from the disk."""
    path = folder / f".bench-disk-{os.getpid()}"
    block = os.urandom(MiB)
    try:
        start = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for _ in range(size // MiB):
                os.write(fd, block)
            os.fsync(fd)
        finally:
            os.close(fd)
        write_s = time.perf_counter() - start
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            start = time.perf_counter()
            while os.read(fd, MiB):
                pass
            read_s = time.perf_counter() - start
        finally:
            os.close(fd)
    finally:
        path.unlink(missing_ok=True)
    return {"write_s": round(write_s, 3), "read_s": round(read_s, 3)}


class _PeakRss:
    """A process's resident memory, sampled every 10 ms: its peak since started."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.before = self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            self._stop.wait(0.01)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return int(self.process.memory_info().rss)


async def _post(rg: Replgate, path: str) -> dict[str, Any]:
    response = await rg.http.post(path, json={}, timeout=600)
    if response.is_error:
        raise RuntimeError(f"POST {path}: {response.status_code} {response.text}")
    result: dict[str, Any] = response.json()
    return result


async def _execute(rg: Replgate, sid: str, code: str) -> dict[str, Any]:
    response = await rg.http.post(f"/v1/sessions/{sid}/execute",
                                  json={"code": code, "timeout_s": 300}, timeout=600)
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    assert result["status"] == "ok", result
    return result


async def _one(rg: Replgate, code: str, check: str) -> dict[str, Any]:
    """Pause a session that ran ``code``, then time its resume + ``1+1``; ``check`` must
    print True after."""
    sid = await rg.create_session()
    try:
        await _execute(rg, sid, code)
        start = time.perf_counter()
        paused = await _post(rg, f"/v1/sessions/{sid}/pause")
        pause_s = time.perf_counter() - start
        start = time.perf_counter()
        await _execute(rg, sid, "1+1")
        resume_s = time.perf_counter() - start
        kept = await _execute(rg, sid, f"print({check})")
        return {"pause_s": round(pause_s, 3), "resume_1plus1_s": round(resume_s, 3),
                "paused_with": paused.get("paused_with"),
                "snapshot_mib": round((paused.get("snapshot_bytes") or 0) / MiB, 1),
                "kept": kept["stdout"].strip() == "True"}
    finally:
        await rg.delete_session(sid)


async def _rounds(rg: Replgate, mib: int, code: str, check: str) -> dict[str, Any]:
    """:data:`ROUNDS` pauses and resumes of a session that ran ``code``, each beside the
    disk's baseline for ``mib`` MiB: the medians, their ratios, and every round."""
    runs = []
    for _ in range(ROUNDS):
        await rg.wait_idle(1)  # the resume takes the warm kernel, as on a quiet gateway
        disk = disk_baseline(rg.state, mib * MiB)
        runs.append({**await _one(rg, code, check), "disk": disk})
    pause_s = statistics.median(run["pause_s"] for run in runs)
    resume_s = statistics.median(run["resume_1plus1_s"] for run in runs)
    write_s = statistics.median(run["disk"]["write_s"] for run in runs)
    read_s = statistics.median(run["disk"]["read_s"] for run in runs)
    return {"pause_s": pause_s, "resume_1plus1_s": resume_s,
            "disk": {"write_s": write_s, "read_s": read_s},
            "pause_vs_write": round(pause_s / write_s, 2),
            "resume_vs_read": round(resume_s / read_s, 2),
            "kept": all(run["kept"] for run in runs),
            "paused_with": sorted({run["paused_with"] for run in runs}),
            "snapshot_mib": max(run["snapshot_mib"] for run in runs),
            "rounds": [{"pause_s": run["pause_s"], "resume_1plus1_s": run["resume_1plus1_s"],
                        **run["disk"]} for run in runs]}


async def pause_sizes() -> dict[str, Any]:
    """The size sweep: variables pauses of each of :data:`SIZES_MIB`, then a memory pause of
    200 MiB (where the engine can checkpoint); each against the disk's own time, in one run
    (medians of :data:`ROUNDS`)."""
    results: dict[str, Any] = {}
    variables = Replgate(min_idle=1, max_kernels=4, settings={
        "REPLGATE_PAUSE_WITH": "variables", "REPLGATE_MEMORY": "3g",
        "REPLGATE_SNAPSHOT_BUDGET": "20g", "REPLGATE_MAX_TIMEOUT_S": "600"})
    try:
        await variables.wait_idle(1)
        rss = _PeakRss(variables.pid)
        for mib in SIZES_MIB:
            results[f"variables_{mib}_mib"] = await _rounds(
                variables, mib, _holding(mib), "float(data[::4096].sum()) == check")
        after = rss.stop()
        results["gateway_rss_mib"] = {"before": round(rss.before / MiB, 1),
                                      "peak": round(rss.peak / MiB, 1),
                                      "after_deletion": round(after / MiB, 1),
                                      "growth": round((rss.peak - rss.before) / MiB, 1)}
    finally:
        await variables.stop()
    memory = Replgate(min_idle=1, max_kernels=4, settings={
        "REPLGATE_PAUSE_WITH": "memory", "REPLGATE_MEMORY": "1g"})
    try:
        results["memory_200_mib"] = await _rounds(
            memory, 200, "import numpy as np\nones = np.ones(200 * 2**20 // 8)\n"
                         "held = open('/tmp/held.txt', 'w+')", "ones.sum() == ones.size")
    finally:
        await memory.stop()
    return results
