"""A variables snapshot's stream, written by the sandbox's side: a large out-of-band buffer goes
into a pipe by reference, and is kept alive until the reader has taken it."""

from __future__ import annotations

import fcntl
import gc
import os
import pickle
import threading
import weakref
from pathlib import Path

import numpy as np
from replgate_kernel import stream

PIPE_BYTES = 1 << 20


def _read_all(fd: int) -> bytes:
    out = bytearray()
    while chunk := os.read(fd, 1 << 16):
        out += chunk
    return bytes(out)


def _record(kind: bytes, data: bytes) -> bytes:
    return bytes(stream.HEADER.pack(kind, len(data))) + data


def test_a_lent_buffer_stays_alive_until_the_reader_took_it() -> None:
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    writer = stream.Writer(write_end, lambda: None)
    # A temporary the pickler made (as a reduce can): only the stream holds it.
    temporary = np.arange(stream.SPLICED_MIN, dtype=np.uint8) * 7
    expected = temporary.tobytes()
    alive = weakref.ref(temporary)
    writer.buffer(pickle.PickleBuffer(temporary.data))
    del temporary
    ending = threading.Thread(target=writer.end)
    ending.start()
    ending.join(0.3)
    gc.collect()
    # In the pipe by reference: its memory is the array's own, which must outlive the read
    # (freed, it would be reused, and the reader would take whatever was written there).
    assert ending.is_alive() and alive() is not None
    read = _read_all_until_end(read_end, writer, ending)
    gc.collect()
    assert alive() is None
    assert read == stream.MAGIC + _record(b"B", expected) + _record(b"E", b"")
    os.close(read_end)


def _read_all_until_end(read_end: int, writer: stream.Writer,
                        ending: threading.Thread) -> bytes:
    out = bytearray()
    while len(out) < len(stream.MAGIC) + 2 * stream.HEADER.size + stream.SPLICED_MIN:
        out += os.read(read_end, 1 << 16)
    ending.join(10)
    assert not ending.is_alive()
    os.close(writer.fd)
    return bytes(out) + _read_all(read_end)


def test_into_a_file_the_buffers_are_written(tmp_path: Path) -> None:
    path = tmp_path / "stream"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    writer = stream.Writer(fd, lambda: None)
    values = np.linspace(0, 1, stream.SPLICED_MIN)
    writer.buffer(pickle.PickleBuffer(values.data))
    writer.end()
    os.close(fd)
    assert path.read_bytes() == (stream.MAGIC + _record(b"B", values.tobytes())
                                 + _record(b"E", b""))
