"""A paused session's bundle moved between nodes through SeaweedFS, against the disk.

    python -m bench.bundles [--mib 200] [--runs 3]

Starts SeaweedFS (``weed`` from the dev extra) on free ports in a temporary folder, then, for
the same bytes in the same run: writes and reads them to a local file (with fsync: the disk's
own limit), writes a sealed bundle through ``s3://`` and reads it back, and the same through
``file://``. The read of a bundle is what a resume on another node waits for (the goal of
issue 27: 200 MiB in <= 2 s). Prints the medians; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from kernel_pool.bundles import PART_SIZE, BundleInfo, BundleKeys, Bundles, open_store

INFO = BundleInfo(paused_with="variables", image_digest="sha256:" + "0" * 64)


def _port_pair() -> int:
    while True:
        port = secrets.randbelow(10000) + 20000
        try:
            for candidate in (port, port + 10000):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port


def _start_seaweedfs(folder: Path) -> subprocess.Popen[bytes]:
    weed = Path(sys.executable).parent / "weed"
    key, secret = "bench", secrets.token_hex(16)
    (folder / "s3.json").write_text(json.dumps({"identities": [{
        "name": "bench", "actions": ["Admin", "Read", "Write", "List"],
        "credentials": [{"accessKey": key, "secretKey": secret}]}]}))
    master, volume, filer, s3 = (_port_pair() for _ in range(4))
    process = subprocess.Popen(
        [str(weed), "server", f"-dir={folder}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
         f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}",
         "-master.volumeSizeLimitMB=1024", "-s3", f"-s3.port={s3}",
         f"-s3.config={folder / 's3.json'}", "-s3.port.iceberg=0", "-s3.port.lance=0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    for url in (f"http://127.0.0.1:{s3}", f"http://127.0.0.1:{filer}"):
        for _ in range(300):
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
    subprocess.run([str(weed), "shell", f"-master=127.0.0.1:{master}"],
                   input=b"s3.bucket.create -name bench\n", check=True, capture_output=True)
    os.environ.update(AWS_ACCESS_KEY_ID=key, AWS_SECRET_ACCESS_KEY=secret,
                      AWS_REGION="us-east-1", AWS_ENDPOINT_URL=f"http://127.0.0.1:{s3}")
    return process


def _chunks(mib: int) -> list[bytes]:
    """The session's bytes: random, so neither the store nor the disk can shortcut them."""
    block = os.urandom(PART_SIZE)
    return [index.to_bytes(8) + block[8:] for index in range(mib * 1024 * 1024 // PART_SIZE)]


def _disk(path: Path, chunks: list[bytes]) -> tuple[float, float]:
    start = time.perf_counter()
    with path.open("wb") as file:
        for chunk in chunks:
            file.write(chunk)
        file.flush()
        os.fsync(file.fileno())
    written = time.perf_counter() - start
    # the page cache would read back at memory speed: drop the file's pages first
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    start = time.perf_counter()
    with path.open("rb") as file:
        while file.read(PART_SIZE):
            pass
    read = time.perf_counter() - start
    path.unlink()
    return written, read


async def _bundle(bundles: Bundles, chunks: list[bytes]) -> tuple[float, float]:
    session = secrets.token_hex(4)
    start = time.perf_counter()
    async with bundles.write("bench", session, INFO) as w, w.part("snapshot") as part:
        for chunk in chunks:
            await part.write(chunk)
    written = time.perf_counter() - start
    start = time.perf_counter()
    bundle = await bundles.open("bench", session)
    async for _ in bundle.read("snapshot"):
        pass
    read = time.perf_counter() - start
    await bundles.delete("bench", session)
    return written, read


async def _main(mib: int, runs: int) -> None:
    chunks = _chunks(mib)
    keys = BundleKeys(os.urandom(32))
    with tempfile.TemporaryDirectory(prefix="replgate-bench-bundles-") as folder:
        root = Path(folder)
        (root / "weed").mkdir()
        weed = _start_seaweedfs(root / "weed")
        try:
            stores: dict[str, Callable[[], Awaitable[tuple[float, float]]]] = {
                "local disk (fsync)": lambda: asyncio.to_thread(_disk, root / "raw", chunks),
                "s3:// SeaweedFS, sealed": lambda: _bundle(
                    Bundles(open_store("s3://bench/bundles"), keys), chunks),
                "file:// sealed": lambda: _bundle(
                    Bundles(open_store((root / "shared").as_uri()), keys), chunks),
            }
            size = len(chunks) * PART_SIZE / 2**20
            print(f"{size:.0f} MiB, median of {runs} runs (write = pause's upload, "
                  "read = resume's download)")
            for name, run in stores.items():
                times = [await run() for _ in range(runs)]
                write = statistics.median(t[0] for t in times)
                read = statistics.median(t[1] for t in times)
                print(f"  {name:26} write {write:6.2f} s ({size / write:6.0f} MiB/s)   "
                      f"read {read:6.2f} s ({size / read:6.0f} MiB/s)")
        finally:
            weed.terminate()
            weed.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(_main(args.mib, args.runs))


if __name__ == "__main__":
    main()
