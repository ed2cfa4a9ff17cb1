"""Snapshots as streams of chunks: from the sandbox through a compressor into storage, and back.

No replgate process holds a whole snapshot in memory: the kernel writes its variables into a
pipe (or a file) as it pickles them, ``zstd`` compresses what it reads from there, and the
gateway moves the compressed bytes to storage :data:`CHUNK` bytes at a time; a resume runs the
same way backwards. Storage is reached through :class:`ChunkWriter` and :class:`ChunkReader`
alone: a folder here (:class:`FileChunkWriter`, :class:`FileChunkReader`), an object store
(multipart uploads, ranged reads) later, behind the same two shapes.

Compression is ``zstd --fast=1`` with a thread per core where the host has ``zstd`` and the
stream's head shows it pays (:func:`worth_compressing`); otherwise a snapshot is stored as it
is. Every call here blocks: callers run them in worker threads.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import stat
import subprocess
import threading
import zlib
from collections.abc import Callable, Sequence
from typing import Protocol

from kernel_pool._chunk_files import CHUNK, FileChunkReader, FileChunkWriter
from kernel_pool.exceptions import SnapshotError

STOP_POLL_MS = 100
"""How often a read from the sandbox's side that waits looks whether it was stopped."""
HEAD_BYTES = 4 << 20
"""What of a snapshot's stream is read before it is known whether to compress it."""
SAMPLE_BYTES = 128 << 10
SMALL_BYTES = 64 << 10
"""A stream that ends within this many bytes is compressed here, with zlib (a fraction of a
millisecond, and its checksum still tells a corrupt snapshot at the resume), not by ``zstd``:
the processes its compression and decompression start (two at the pause, one at the resume)
cost more CPU than the whole snapshot. A session that holds little is paused so to make room
for another, a hundred times in a burst."""
ZSTD = shutil.which("zstd")
COMPRESS = [ZSTD or "zstd", "-q", "--fast=1", "-T0", "-c"]
DECOMPRESS = [ZSTD or "zstd", "-q", "-d", "-c"]
SUFFIXES = (".zst", ".raw", ".zlib")
"""What a stored snapshot may be: zstd, as it is, or zlib (a small one, and all of earlier
versions')."""

Progress = Callable[[int], None]
"""Called with the bytes done so far (from a worker thread)."""


class ChunkWriter(Protocol):
    """Where a snapshot's compressed bytes go, in order; nothing is kept before commit."""

    def write(self, chunk: bytes) -> None:
        """Append ``chunk`` (:class:`SnapshotBudgetExceeded` when storage has no room)."""

    def commit(self) -> int:
        """Make what was written durable and visible under its name; its size."""

    def abort(self) -> None:
        """Drop what was written (nothing is left of it)."""


class ChunkReader(Protocol):
    """A stored snapshot's bytes, in order."""

    size: int

    def read(self, size: int = CHUNK) -> bytes:
        """The next bytes, at most ``size``; ``b""`` at the end."""

    def close(self) -> None: ...


class Pump:
    """One stream's move between a descriptor of the sandbox's side (a pipe's end, or a
    file) and storage, through the codec; :meth:`stop` (any thread) cuts it short."""

    def __init__(self) -> None:
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def wait(self, seconds: float) -> None:
        """Sleep ``seconds``, or until stopped."""
        self._stopped.wait(seconds)

    def stop(self) -> None:
        with self._lock:
            self._stopped.set()
            if self._process is not None:
                with contextlib.suppress(OSError):
                    self._process.kill()

    def _start(self, command: list[str], stdin: int, stdout: int) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._stopped.is_set():
                raise SnapshotError("the snapshot was stopped")
            # A stop signal to the gateway's group must not kill the compressor under a
            # pause: the pause's own end (or stop()) ends it.
            self._process = subprocess.Popen(
                command, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE,
                start_new_session=True)
            return self._process

    def _finish(self, process: subprocess.Popen[bytes], what: str) -> None:
        assert process.stderr is not None
        said = process.stderr.read(4096).decode(errors="replace").strip()
        process.stderr.close()
        if process.wait() and not self.stopped:
            raise SnapshotError(f"{what} failed (exit status {process.returncode})"
                                f"{': ' + said[-300:] if said else ''}")

    def out(self, source: int, writer: ChunkWriter,
            progress: Progress | None = None) -> str:
        """Move what ``source`` gives (to its end) into ``writer``; ``source`` is closed.
        How it was stored (its suffix): compressed, unless the stream's head says it would
        not shrink (:func:`worth_compressing`); a small one by zlib (:data:`SMALL_BYTES`).
        ``progress``: the source's bytes read so far, roughly."""
        try:
            head = self._head(source)
        except BaseException:
            os.close(source)
            raise
        ended = len(head) < HEAD_BYTES  # the stream's end came within its head
        if ended and len(head) <= SMALL_BYTES:
            os.close(source)
            writer.write(zlib.compress(head, 1))
            if progress is not None:
                progress(len(head))
            return ".zlib"
        if ZSTD is None or not worth_compressing(head):
            # From a pipe into a file, the bytes move within the kernel: at 1 GiB, the two
            # copies through this process took about as long as the disk's own writing.
            spliced = writer if isinstance(writer, FileChunkWriter) and _is_pipe(source) \
                else None
            try:
                writer.write(head)
                done = len(head)
                while True:
                    if spliced is not None:
                        self._wait_unless_stopped(source)
                        moved = spliced.splice_from(source)
                    else:
                        chunk = self._read_unless_stopped(source)
                        writer.write(chunk)
                        moved = len(chunk)
                    if not moved:
                        break
                    done += moved
                    if progress is not None:
                        progress(done)
            finally:
                os.close(source)
            return ".raw"
        try:
            # The head as a frame of its own, the rest as the next: zstd reads a stream of
            # frames as one, and the compressor reads the rest from the source directly.
            process = self._start(COMPRESS, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            compressed, _ = process.communicate(head)
            if process.returncode and not self.stopped:
                raise SnapshotError(f"compressing the snapshot failed (exit status "
                                    f"{process.returncode})")
            writer.write(compressed)
            if ended:  # one frame holds it all: no compressor for an empty rest
                if progress is not None:
                    progress(len(head))
                return ".zst"
            process = self._start(COMPRESS, stdin=source, stdout=subprocess.PIPE)
        finally:
            os.close(source)  # the compressor holds it: its end is the stream's end
        assert process.stdout is not None
        try:
            while chunk := process.stdout.read(CHUNK):
                writer.write(chunk)
                if progress is not None:
                    progress(len(head) + _bytes_read(process.pid))
        except BaseException:
            self.stop()
            raise
        finally:
            process.stdout.close()
            self._finish(process, "compressing the snapshot")
        if self.stopped:
            raise SnapshotError("the snapshot was stopped")
        return ".zst"

    def _head(self, source: int) -> bytes:
        """The stream's first :data:`HEAD_BYTES` (all of it, when shorter)."""
        head = bytearray()
        while len(head) < HEAD_BYTES and (chunk := self._read_unless_stopped(source)):
            head += chunk
        return bytes(head)

    def _read_unless_stopped(self, source: int) -> bytes:
        """The next bytes of ``source`` (empty at its end); a read that would wait is polled,
        so that :meth:`stop` ends it (no codec process to kill here)."""
        self._wait_unless_stopped(source)
        return _read(source)

    def _wait_unless_stopped(self, source: int) -> None:
        """Wait until ``source`` has bytes or its end, polling whether it was stopped."""
        poller = select.poll()
        poller.register(source, select.POLLIN | select.POLLHUP)
        while not poller.poll(STOP_POLL_MS):
            if self.stopped:
                raise SnapshotError("the snapshot was stopped")
        if self.stopped:
            raise SnapshotError("the snapshot was stopped")

    def into(self, reader: ChunkReader, suffix: str, target: int,
             progress: Progress | None = None) -> None:
        """Move ``reader``'s stream, decompressed as ``suffix`` says, into ``target`` (closed
        at the end, which the sandbox's side reads as the stream's end). ``progress``: the
        stored bytes read so far."""
        if suffix != ".zst":
            try:
                self._copy_into(reader, suffix, target, progress)
            finally:
                os.close(target)
            return
        try:
            process = self._start(DECOMPRESS, stdin=subprocess.PIPE, stdout=target)
        finally:
            os.close(target)
        assert process.stdin is not None
        done = 0
        try:
            while not self.stopped and (chunk := reader.read(CHUNK)):
                process.stdin.write(chunk)
                done += len(chunk)
                if progress is not None:
                    progress(done)
        except BrokenPipeError:
            if not self.stopped:  # the sandbox's side stopped reading: its reason comes
                raise SnapshotError("the kernel stopped reading the snapshot") from None
        except BaseException:
            self.stop()
            raise
        finally:
            with contextlib.suppress(BrokenPipeError):
                process.stdin.close()
            self._finish(process, "the session's snapshot is corrupt: decompressing it")

    def _copy_into(self, reader: ChunkReader, suffix: str, target: int,
                   progress: Progress | None) -> None:
        inflate = zlib.decompressobj() if suffix == ".zlib" else None
        done = 0
        try:
            if inflate is None and isinstance(reader, FileChunkReader):
                # Not one call past the file's end: the kernel closes its end once it has
                # read the stream's last record, and a sendfile into a pipe with no reader
                # fails (EPIPE) even with nothing left to send (a resume's 409 at random).
                while (not self.stopped and done < reader.size
                       and (sent := reader.send(target))):
                    done += sent
                    if progress is not None:
                        progress(done)
                return
            while not self.stopped and (chunk := reader.read(CHUNK)):
                done += len(chunk)
                if inflate is None:
                    _write(target, chunk)
                else:
                    data = inflate.decompress(chunk, CHUNK)
                    while data:
                        _write(target, data)
                        data = inflate.decompress(inflate.unconsumed_tail, CHUNK)
                if progress is not None:
                    progress(done)
            if inflate is not None and not inflate.eof and not self.stopped:
                raise SnapshotError("the session's snapshot is corrupt: it was cut short")
        except zlib.error as exc:
            raise SnapshotError(f"the session's snapshot is corrupt: {exc}") from exc
        except BrokenPipeError:
            if not self.stopped:
                raise SnapshotError("the kernel stopped reading the snapshot") from None


def copy(reader: ChunkReader, writer: ChunkWriter) -> int:
    """Copy a stored snapshot as it is (a fork's paused copies); the writer is committed."""
    try:
        while chunk := reader.read(CHUNK):
            writer.write(chunk)
    except BaseException:
        writer.abort()
        raise
    return writer.commit()


def worth_compressing(head: bytes) -> bool:
    """Whether a stream that begins with ``head`` is worth compressing: samples of it shrink
    by a tenth at least with a fast codec.

    Random floats (measurements, simulations) do not shrink, and compressing them costs more
    than the bytes saved: on the 2-core development machine 1 GiB of them stored in 0.5-1.1 s
    as they are and in 1.9-2.2 s through ``zstd --fast=1``. The samples come from the head's
    end and middle: the kernel writes its small values first, so the end is the first large
    value's.
    """
    if len(head) <= SAMPLE_BYTES:
        return True  # small: its size matters more than the milliseconds
    return shrinks((head[-SAMPLE_BYTES:], head[len(head) // 2:len(head) // 2 + SAMPLE_BYTES]),
                   0.9)


def shrinks(samples: Sequence[bytes], at_most: float) -> bool:
    """Whether ``samples`` compress to ``at_most`` of their size with zlib's fastest level:
    the test, on a few pieces of some data, of whether compressing all of it pays."""
    packed = sum(len(zlib.compress(sample, 1)) for sample in samples)
    return packed <= at_most * sum(len(sample) for sample in samples)


def _is_pipe(fd: int) -> bool:
    return stat.S_ISFIFO(os.fstat(fd).st_mode)


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, CHUNK)
    except BlockingIOError:  # a pipe opened without blocking: wait for its writer's bytes
        os.set_blocking(fd, True)
        return os.read(fd, CHUNK)


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _bytes_read(pid: int) -> int:
    """What process ``pid`` read so far (``rchar`` of its ``/proc/PID/io``), or 0."""
    try:
        with open(f"/proc/{pid}/io", "rb") as f:
            for line in f:
                if line.startswith(b"rchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0

