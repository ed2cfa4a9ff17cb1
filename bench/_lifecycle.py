"""Session lifecycle figures: pause, resume on first use, fork, against starting afresh; and
how many paused sessions one gateway holds.

Every figure goes through the gateway's HTTP API, as a client sees it. The baselines, taken in
the same run: a cold session start plus ``1+1`` (what a client without pause pays to get a
kernel back, variables lost) and four sessions created at once (what a fork of four replaces).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

from bench._measure import summary
from bench._peers import Replgate

DATA_STACK = ("import numpy as np, pandas as pd, matplotlib.pyplot as plt\n"
              "frame = pd.DataFrame({'x': np.arange(100_000), 'y': np.random.random(100_000)})\n"
              "total = float(frame.y.sum())")
HELD_WORKSPACE_SIZE = "1g"
"""The held sessions' workspace cap (the default): a running session's workspace reserves it on
the host's disk, a paused one gives back what its files do not use (the figure reports what
each paused session keeps)."""
FORK_MAX = 16
"""The most copies one fork request makes (the contract's bound)."""


async def _post(rg: Replgate, path: str, body: dict[str, Any] | None = None) -> Any:
    response = await rg.http.post(path, json=body or {})
    if response.is_error:
        raise RuntimeError(f"POST {path}: {response.status_code} {response.text}")
    return response.json()


async def lifecycle(rg: Replgate, cold: Replgate, cold_boot: Replgate, repeats: int,
                    warm: int = 2) -> dict[str, Any]:
    """pause p50 and snapshot size; resume + 1+1 p50 (vs cold start + 1+1); fork of 4,
    answered and with ``1+1`` run in every copy (vs four sessions created at once); each
    figure starts with ``warm`` warm kernels ready (``rg``'s ``min_idle``). Cold starts on
    ``cold`` (kernels from a template) and ``cold_boot`` (templates off: booted)."""
    pause, resume, sizes, cold_starts, boot_starts = [], [], [], [], []
    forks, fork_runs, creates = [], [], []
    paused_copies = []
    for _ in range(repeats):
        sid = await rg.create_session()
        await rg.http_execute(sid, DATA_STACK)
        await rg.wait_idle(warm)
        start = time.perf_counter()
        paused = await _post(rg, f"/v1/sessions/{sid}/pause")
        pause.append((time.perf_counter() - start) * 1000)
        sizes.append(paused["snapshot_bytes"])
        start = time.perf_counter()
        result = await rg.http_execute(sid, "1+1")
        resume.append((time.perf_counter() - start) * 1000)
        assert result["status"] == "ok", result

        await rg.wait_idle(warm)
        start = time.perf_counter()
        children = await _post(rg, f"/v1/sessions/{sid}/fork", {"count": 4})
        forks.append((time.perf_counter() - start) * 1000)
        paused_copies.append(sum(child["status"] == "paused" for child in children))
        ran = await asyncio.gather(*(rg.http_execute(child["id"], "total")
                                     for child in children))
        fork_runs.append((time.perf_counter() - start) * 1000)
        assert all(r["status"] == "ok" for r in ran), ran
        for child in children:
            await rg.delete_session(child["id"])
        await rg.delete_session(sid)

        await rg.wait_idle(warm)
        start = time.perf_counter()
        made = await asyncio.gather(*(rg.create_session() for _ in range(4)))
        creates.append((time.perf_counter() - start) * 1000)
        for other in made:
            await rg.delete_session(other)

        for gateway, starts in ((cold, cold_starts), (cold_boot, boot_starts)):
            start = time.perf_counter()
            fresh = await gateway.create_session()
            await gateway.http_execute(fresh, "1+1")
            starts.append((time.perf_counter() - start) * 1000)
            await gateway.delete_session(fresh)
    return {"pause": summary(pause), "resume_execute": summary(resume),
            "cold_start_execute": summary(cold_starts),
            "cold_boot_execute": summary(boot_starts), "fork4": summary(forks),
            "fork4_run": summary(fork_runs), "create4": summary(creates),
            "fork4_paused_copies": statistics.median(paused_copies),
            "snapshot_mib": round(statistics.median(sizes) / 2**20, 2),
            "paused_with": "variables", "warm_kernels": warm}


PACKING_WAIT_S = 2.0
"""Between a pause and the resume timed after it: a memory pause's packing (0.3-0.4 s) ends."""


async def pause_with(variables: Replgate, memory: Replgate, repeats: int) -> dict[str, Any]:
    """Pause, and resume + ``1+1``, of a session with the data stack imported, on a gateway
    that pauses with variables (dill) and one that pauses with memory (a CRIU checkpoint:
    the engine's runc dumps, the engine restores), taken in turns in the same run; and each
    paused image's size."""
    gateways = {"variables": variables, "memory": memory}
    pauses: dict[str, list[float]] = {name: [] for name in gateways}
    resumes: dict[str, list[float]] = {name: [] for name in gateways}
    sizes: dict[str, list[int]] = {name: [] for name in gateways}
    kept: dict[str, list[str]] = {name: [] for name in gateways}
    for _ in range(repeats):
        for name, rg in gateways.items():
            sid = await rg.create_session()
            await rg.http_execute(sid, DATA_STACK)
            await rg.wait_idle(1)
            start = time.perf_counter()
            paused = await _post(rg, f"/v1/sessions/{sid}/pause")
            pauses[name].append((time.perf_counter() - start) * 1000)
            kept[name].append(paused["paused_with"])
            # A memory pause answers before its packing: the resume is timed from the
            # archive (as after any real pause), the size is the packed one.
            await asyncio.sleep(PACKING_WAIT_S)
            about = await rg.http.get(f"/v1/sessions/{sid}")
            sizes[name].append(about.json()["snapshot_bytes"])
            start = time.perf_counter()
            result = await rg.http_execute(sid, "1+1")
            resumes[name].append((time.perf_counter() - start) * 1000)
            assert result["status"] == "ok", result
            await rg.delete_session(sid)
    return {name: {"pause": summary(pauses[name]), "resume_execute": summary(resumes[name]),
                   "image_mib": round(statistics.median(sizes[name]) / 2**20, 2),
                   "paused_with": sorted(set(kept[name]))}
            for name in gateways}


def _host_holds(state: str) -> dict[str, int]:
    """Mounts and loop devices the gateway holds under its state directory now."""
    with open("/proc/self/mountinfo") as f:
        mounts = sum(line.split()[4].startswith(state + "/") for line in f)
    loops = 0
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            loops += backing.read_text().startswith(state + "/")
    return {"mounts": mounts, "loop_devices": loops}


def _parked_images(state: str) -> list[int]:
    """Bytes on disk of each workspace image not mounted (a paused session's, parked)."""
    sizes = []
    for image in Path(state, "workspaces").glob("*.ext4"):
        with contextlib.suppress(OSError):
            if not os.path.ismount(image.with_suffix("")):
                sizes.append(image.stat().st_blocks * 512)
    return sizes


def _snapshot_sizes(state: str) -> list[int]:
    """Bytes of each paused session's snapshot (zstd or zlib)."""
    return [f.stat().st_size for f in Path(state, "snapshots").iterdir()
            if f.suffix in (".zst", ".zlib")]


def _disk_bytes(path: str) -> int:
    """Blocks used under ``path`` on its own file system (mounted workspaces' contents are in
    their images, counted once)."""
    out = subprocess.run(["du", "-sx", "--block-size=1", path], capture_output=True,
                         text=True, check=True).stdout
    return int(out.split()[0])


async def held(n: int, sample: int) -> dict[str, Any]:
    """``n`` paused sessions on one gateway with at most 8 running kernels: made by forking
    a paused session (the data stack imported), with the disk and gateway memory each takes;
    then ``sample`` of them, spread over the lot, resumed one after another."""
    rg = Replgate(min_idle=2, max_kernels=8, settings={
        "REPLGATE_WORKSPACE_SIZE": HELD_WORKSPACE_SIZE,
        "REPLGATE_MAX_SESSIONS_PER_TENANT": str(n + 1)})
    try:
        await rg.wait_idle(2)
        parent = await rg.create_session()
        await rg.http_execute(parent, DATA_STACK + "\nmark = 'held'")
        await _post(rg, f"/v1/sessions/{parent}/pause")
        gateway = psutil.Process(rg.pid)
        rss_before, disk_before = gateway.memory_info().rss, _disk_bytes(str(rg.state))
        holds_before = _host_holds(str(rg.state))
        ids: list[str] = []
        start = time.perf_counter()
        while len(ids) < n:
            children = await _post(rg, f"/v1/sessions/{parent}/fork",
                                   {"count": min(FORK_MAX, n - len(ids))})
            ids += [child["id"] for child in children]
        made_s = time.perf_counter() - start
        pool = await rg.pool()
        rss_after, disk_after = gateway.memory_info().rss, _disk_bytes(str(rg.state))
        holds_after = _host_holds(str(rg.state))
        parked = _parked_images(str(rg.state))
        snapshots = _snapshot_sizes(str(rg.state))
        resumes, correct = [], 0
        for sid in ids[:: max(1, len(ids) // sample)][:sample]:
            start = time.perf_counter()
            result = await rg.http_execute(sid, "(mark, round(total, 6) == round(float("
                                                "frame.y.sum()), 6))")
            resumes.append((time.perf_counter() - start) * 1000)
            text = (result.get("outputs") or [{}])[-1].get("data", {}).get("text/plain")
            correct += result["status"] == "ok" and text == "('held', True)"
        running = (await rg.pool())["in_use"]
        for sid in ids:
            await rg.delete_session(sid)
        await rg.delete_session(parent)
    finally:
        await rg.stop()
    per_disk = (disk_after - disk_before) / n
    return {
        "sessions": n, "workspace_size": HELD_WORKSPACE_SIZE,
        "made_per_s": round(n / made_s, 1), "paused_after": pool["paused"],
        "running_kernels_after_resumes": running,
        "disk_per_paused_mib": round(per_disk / 2**20, 2),
        "gateway_rss_per_paused_kib": round((rss_after - rss_before) / n / 1024, 1),
        "parked_workspaces": len(parked),
        "parked_workspace_mib": {"median": round(statistics.median(parked) / 2**20, 2),
                                 "max": round(max(parked) / 2**20, 2)} if parked else None,
        "snapshot_mib": round(statistics.median(snapshots) / 2**20, 2) if snapshots else None,
        "mounts_before": holds_before["mounts"], "mounts_after": holds_after["mounts"],
        "loop_devices_before": holds_before["loop_devices"],
        "loop_devices_after": holds_after["loop_devices"],
        "resume_execute": summary(resumes), "resume_ms": [round(ms) for ms in resumes],
        "resumed_correct": f"{correct}/{len(resumes)}",
        "free_disk_gib": round(shutil.disk_usage(os.path.dirname(rg.state)).free / 2**30, 1)}
