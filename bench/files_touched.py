"""What "files touched" costs on a workspace of 100,000 files, measured inside a real sandbox.

    python -m bench.files_touched [--files 100000] [--per-folder 100]

It starts a session (a 4 GiB workspace, for the inodes), fills the workspace with small files,
then times, in the kernel, the two ways ``replgate_kernel/files.py`` can tell what an execution
changed: a snapshot of every file's size and mtime taken before and after (the fallback), and
the inotify watches the kernel uses (set up once, then drained per execution). It also times a
trivial execution end to end through the gateway's pool before and after the workspace filled
up, which is what a user pays. Prints ratios; asserts nothing (no timing in tests).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from kernel_pool import KernelPool, PoolSettings, Profile, Session

MEASURE = """
import json, os, time
from replgate_kernel import files

files.MAX_SNAPSHOT = 10**9  # the fallback stops at 5,000 files; here it walks them all

def timed(action, repeat=5):
    spent = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        spent.append(time.perf_counter() - started)
    return sorted(spent)[len(spent) // 2] * 1000

snapshot = files.SnapshotTracker("/home/user")
def snapshot_execution():
    snapshot.start()
    open("bench/f0/changed.txt", "w").write("x")
    snapshot.finish()

started = time.perf_counter()
watched = files.InotifyTracker("/home/user")
setup_ms = (time.perf_counter() - started) * 1000
def inotify_execution():
    watched.start()
    open("bench/f0/changed.txt", "w").write("x")
    watched.finish()

print(json.dumps({"snapshot_ms": timed(snapshot_execution), "inotify_ms": timed(inotify_execution),
                  "inotify_setup_ms": setup_ms, "watches": len(watched._dirs),
                  "files": sum(len(f) for _, _, f in os.walk("/home/user"))}))
"""

FILL = """
import os
for folder in range({folders}):
    path = f"bench/f{{folder}}"
    os.makedirs(path, exist_ok=True)
    for number in range({per_folder}):
        with open(f"{{path}}/{{number}}.txt", "w") as f:
            f.write("x")
"""


async def round_trip_ms(session: Session, repeat: int = 20) -> float:
    spent = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = await session.execute("1 + 1")
        assert result.status == "ok", result
        spent.append(time.perf_counter() - started)
    return statistics.median(spent) * 1000


async def main(files: int, per_folder: int) -> None:
    state = Path(tempfile.mkdtemp(prefix="rg-bench-", dir="/tmp"))
    profile = Profile(name="default", min_idle=0, workspace_size="4g", memory="1g",
                      default_timeout_s=600, max_timeout_s=600)
    pool = KernelPool(PoolSettings(state_dir=state, profiles={"default": profile},
                                   owner=f"bench-{secrets.token_hex(4)}"))
    await pool.start()
    try:
        session = await pool.create_session()
        empty_ms = await round_trip_ms(session)
        filled = await session.execute(FILL.format(folders=files // per_folder,
                                                   per_folder=per_folder), timeout_s=600)
        assert filled.status == "ok", filled.error
        print(f"filling the workspace: {filled.duration_ms / 1000:.1f} s; its execution listed "
              f"{len(filled.files)} files (truncated={filled.truncated})")
        full_ms = await round_trip_ms(session)
        measured = await session.execute(MEASURE, timeout_s=600)
        assert measured.status == "ok", measured.error
        figures = json.loads(measured.stdout)
    finally:
        await pool.close()
        shutil.rmtree(state, ignore_errors=True)
    print(f"workspace: {figures['files']} files in {figures['watches']} folders")
    print(f"per execution, snapshot of mtimes (before + after): {figures['snapshot_ms']:.1f} ms")
    print(f"per execution, inotify (drain before + after):      {figures['inotify_ms']:.3f} ms")
    print(f"  ratio snapshot / inotify: {figures['snapshot_ms'] / figures['inotify_ms']:.0f}x")
    print(f"inotify set-up, once per kernel start:               "
          f"{figures['inotify_setup_ms']:.1f} ms")
    print(f"'1 + 1' through the pool, empty workspace: {empty_ms:.2f} ms; with "
          f"{figures['files']} files: {full_ms:.2f} ms (ratio {full_ms / empty_ms:.2f})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--per-folder", type=int, default=100)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.files, arguments.per_folder))
