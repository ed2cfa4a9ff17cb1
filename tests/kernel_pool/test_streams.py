"""The snapshot pump (kernel_pool._streams) against a real pipe whose reader stops at the end."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from kernel_pool._chunk_files import FileChunkReader
from kernel_pool._streams import Pump

SIZE = 256 * 1024 + 17
ROUNDS = 200


def _read_exactly_then_close(source: int, size: int, got: list[bytes]) -> None:
    """As the kernel reads a snapshot: to its last record, then its end of the pipe closes."""
    data = bytearray()
    while len(data) < size:
        chunk = os.read(source, size - len(data))
        if not chunk:
            break
        data += chunk
    os.close(source)
    got.append(bytes(data))


def test_a_stored_snapshot_is_moved_whole_into_a_reader_that_closes_at_its_end(
        tmp_path: Path) -> None:
    """Not one sendfile past the file's end: into a pipe whose reader has closed, that call
    fails (EPIPE) though nothing is left to send, which a resume reported as "the kernel
    stopped reading the snapshot" (a 409 at random, about half the runs of a lifecycle test)."""
    stored = tmp_path / "snapshot"
    payload = os.urandom(SIZE)
    stored.write_bytes(payload)
    for _ in range(ROUNDS):
        source, target = os.pipe()
        got: list[bytes] = []
        reader = threading.Thread(target=_read_exactly_then_close, args=(source, SIZE, got))
        reader.start()
        chunks = FileChunkReader(stored)
        try:
            Pump().into(chunks, "", target)  # raises SnapshotError on EPIPE
        finally:
            chunks.close()
            reader.join()
        assert got == [payload]
