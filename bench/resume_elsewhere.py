"""A paused session of 200 MiB resumed on another node, through SeaweedFS (issue 27: <= 2 s).

    python -m bench.resume_elsewhere [--mib 200] [--runs 3]

Starts SeaweedFS (``weed`` from the dev extra) and two kernel pools of their own in this
process, each with its own state directory, as two nodes are (they share nothing but the
store). A session on the first holds ``--mib`` MiB of random floats (which no compression
shortens) and a file in its workspace; it is paused and its bundle written, sealed, to
``s3://`` as a node's pause writes it. The second pool then restores it (the bundle read and
checked: the snapshot to its state directory, the files into a new sandbox's workspace) and
runs ``x.sum()`` in it, which resumes it (a kernel started, the variables loaded). Prints the
medians of each step and of the whole, the figure of the goal; asserts nothing. The gateway's
hops (a lookup in the database, two requests over TLS) come on top: milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.bundles import _start_seaweedfs
from kernel_pool import KernelPool, PoolSettings, Profile
from kernel_pool.bundles import (
    BundleInfo,
    BundleKeys,
    Bundles,
    open_store,
    read_session,
    write_session,
)

FILL = """
import numpy as np, pathlib
x = np.random.default_rng().random({count})
pathlib.Path('notes.txt').write_text('kept')
"""


def _pool(state: Path, name: str) -> KernelPool:
    profile = Profile(name="default", min_idle=1, workspace_size="1g", memory="2g",
                      default_timeout_s=600, max_timeout_s=600)
    return KernelPool(PoolSettings(state_dir=state / name, profiles={"default": profile},
                                   owner=f"bench-{name}-{secrets.token_hex(4)}"))


async def _one(first: KernelPool, second: KernelPool, bundles: Bundles,
               mib: int) -> dict[str, float]:
    session = await first.create_session()
    filled = await session.execute(FILL.format(count=mib * 2**20 // 8), timeout_s=600)
    assert filled.status == "ok", filled.error
    times: dict[str, float] = {}
    started = time.perf_counter()
    info = await session.pause()
    times["pause (snapshot to disk)"] = time.perf_counter() - started
    started = time.perf_counter()
    await write_session(bundles, "bench", session.id,
                        BundleInfo(paused_with="variables", image_digest="bench",
                                   kept=info.kept, not_kept=info.not_kept),
                        first.snapshots, session.workspace)
    times["bundle upload"] = time.perf_counter() - started
    await first.delete_session(session.id)
    await second.wait_ready()
    started = time.perf_counter()
    bundle = await bundles.open("bench", session.id)
    restored = await second.restore_session(
        lambda workspace: read_session(bundle, session.id, second.snapshots, workspace),
        session_id=session.id)
    restore = time.perf_counter()
    result = await restored.execute("print(x.sum() > 0, open('notes.txt').read())")
    done = time.perf_counter()
    assert result.status == "ok" and result.stdout == "True kept\n", result
    times["restore on the other node (download)"] = restore - started
    times["resume and first execution"] = done - restore
    times["resumed on the other node, in all"] = done - started
    times["bundle size (MiB, as stored)"] = sum(
        part.size for part in bundle.manifest.parts.values()) / 2**20
    await second.delete_session(session.id)
    await bundles.delete("bench", session.id)
    return times


async def _main(mib: int, runs: int) -> None:
    state = Path(tempfile.mkdtemp(prefix="rg-bench-resume-", dir="/tmp"))
    (state / "weed").mkdir()
    weed = _start_seaweedfs(state / "weed")
    first, second = _pool(state, "a"), _pool(state, "b")
    try:
        await first.start()
        await second.start()
        bundles = Bundles(open_store("s3://bench/sessions"), BundleKeys(os.urandom(32)))
        measured = [await _one(first, second, bundles, mib) for _ in range(runs)]
    finally:
        await first.close()
        await second.close()
        weed.terminate()
        weed.wait(timeout=30)
        shutil.rmtree(state, ignore_errors=True)
    print(f"a paused session of {mib} MiB (random floats) resumed on another node through "
          f"SeaweedFS, sealed; median of {runs} runs")
    for step in measured[0]:
        unit = "" if "MiB" in step else " s"
        print(f"  {step:40} {statistics.median(m[step] for m in measured):6.2f}{unit}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(_main(args.mib, args.runs))


if __name__ == "__main__":
    main()
