"""Snapshots stored as files: one written as ``<path>.part`` and renamed when committed, and
one read back, each a megabyte at a time or moved within the kernel (``splice``, ``sendfile``).
Every call here blocks: callers run them in worker threads.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable

from kernel_pool.exceptions import SnapshotBudgetExceeded, SnapshotError

CHUNK = 1 << 20
WRITEBACK_BYTES = 32 << 20
"""A written file is handed to the disk this often, so the final fsync has little left."""


def _storage_error(exc: OSError) -> SnapshotError:
    """The file system's words without the path: the host's folders are not the tenant's."""
    error = SnapshotBudgetExceeded if exc.errno in (errno.ENOSPC, errno.EDQUOT) \
        else SnapshotError
    return error("the snapshot could not be written to the state directory: "
                 f"{exc.strerror or type(exc).__name__}")


class FileChunkWriter:
    """A file (0600) written as ``<path>.part``, renamed to ``path`` when committed.
    ``reserve`` is asked before each chunk is written (a budget's check)."""

    def __init__(self, path: os.PathLike[str] | str,
                 reserve: Callable[[int], None] = lambda _n: None) -> None:
        self.path = os.fspath(path)
        self.partial = self.path + ".part"
        self._reserve = reserve
        self.written = 0
        self._synced = 0
        try:
            self._fd = os.open(self.partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                               | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise _storage_error(exc) from exc

    def write(self, chunk: bytes) -> None:
        self._reserve(len(chunk))
        view = memoryview(chunk)
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as exc:
            raise _storage_error(exc) from exc
        self.written += len(chunk)
        self._write_back()

    def splice_from(self, source: int, size: int = CHUNK) -> int:
        """Move the next bytes of the pipe ``source``, at most ``size``, into the file within
        the kernel (no copy through this process); how many (0 at the pipe's end). They are
        counted against the budget once moved: past it, the caller aborts the file."""
        try:
            moved = os.splice(source, self._fd, size)
        except OSError as exc:
            raise _storage_error(exc) from exc
        if moved:
            self._reserve(moved)
            self.written += moved
            self._write_back()
        return moved

    def _write_back(self) -> None:
        if self.written - self._synced >= WRITEBACK_BYTES:
            # Start the disk's writing now (and keep the page cache lean): the fsync at
            # the commit then waits for the last few megabytes only.
            os.posix_fadvise(self._fd, self._synced, self.written - self._synced,
                             os.POSIX_FADV_DONTNEED)
            self._synced = self.written

    def commit(self, path: os.PathLike[str] | str | None = None) -> int:
        """Make the file durable under its name (or under ``path``); its size."""
        try:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1
            os.replace(self.partial, self.path if path is None else path)
        except OSError as exc:
            self.abort()
            raise _storage_error(exc) from exc
        return self.written

    def abort(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.partial)


class FileChunkReader:
    """A stored file's bytes (:class:`SnapshotError` when it cannot be opened)."""

    def __init__(self, path: os.PathLike[str] | str) -> None:
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            self.size = os.fstat(self._fd).st_size
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # a larger readahead
        except OSError as exc:
            raise SnapshotError(f"the session's snapshot cannot be read: "
                                f"{exc.strerror or exc}") from exc

    def read(self, size: int = CHUNK) -> bytes:
        return os.read(self._fd, size)

    def send(self, target: int, size: int = CHUNK) -> int:
        """Move the next bytes, at most ``size``, into ``target`` within the kernel (no copy
        through this process); how many (0 at the end)."""
        return os.sendfile(target, self._fd, None, size)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
