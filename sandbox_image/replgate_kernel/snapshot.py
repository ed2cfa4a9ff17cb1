"""Kernel-side half of a variables snapshot: the user namespace to a stream and back, with dill.

The gateway evaluates :func:`save` or :func:`load` as a user expression of a silent execution
(nothing lands in the history or the namespace) and reads the JSON text they return. The
stream is a named pipe the gateway reads (or feeds) as the kernel writes (or reads) it, or,
where the sandbox cannot share a pipe with the host (gVisor), a file in the workspace.

No second copy of the data is ever made in the sandbox: the pickle is protocol 5, and every
buffer a value exposes (numpy arrays, and pandas frames through them) goes out of band,
written to the stream straight from the value's own memory, and read back into one buffer
that the loaded value then uses as its memory (an array of plain Python values, a string
column, is the exception: pickled whole by the C pickler, those bytes go out of band, one
array at a time; see :mod:`replgate_kernel.plain`). The stream's records are
:mod:`replgate_kernel.stream`'s; a stream without its magic is a plain dill pickle (snapshots
of earlier versions). While it writes, the snapshot watches the sandbox's memory: one that
would leave less than :data:`MIN_FREE_BYTES` free stops (:class:`SnapshotRefused`) and the
kernel goes on unchanged.
"""

import io
import json
import os
import random
import sys
import tempfile
import threading
from typing import Any

import dill
from IPython import get_ipython

from replgate_kernel import plain
from replgate_kernel.stream import MAGIC, Reader, Restart, Writer

MAX_REASON = 200
# The kernel's own folders in /tmp (made at its start, see __main__): not the user's files.
KERNEL_TMP_PREFIXES = (".ipythondir-", ".mplconfigdir-")
# /tmp entries named one by one in what a snapshot did not keep; past that, a count.
MAX_TMP_LISTED = 10
MIN_FREE_BYTES = 16 << 20
"""The memory a snapshot leaves free in the sandbox at least, or it stops."""
CGROUP_FILES = (  # (usage, limit, stat, the stat's reclaimable line): v2, then v1
    ("/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.max",
     "/sys/fs/cgroup/memory.stat", b"inactive_file"),
    ("/sys/fs/cgroup/memory/memory.usage_in_bytes", "/sys/fs/cgroup/memory/memory.limit_in_bytes",
     "/sys/fs/cgroup/memory/memory.stat", b"total_inactive_file"))

_kernel_threads: set[int | None] | None = None
"""The threads the kernel runs before any cell (IOPub, heartbeat, control, output pipes)."""


class SnapshotRefused(Exception):
    """The snapshot stopped before the sandbox ran out of memory; nothing was changed."""


def install(shell: Any) -> None:
    """Note the kernel's own threads at the first execution, before any user code has run:
    threads started later are the user's, which a variables snapshot cannot keep."""

    def note_kernel_threads(*args: object) -> None:
        global _kernel_threads
        _kernel_threads = {thread.ident for thread in threading.enumerate()}
        shell.events.unregister("pre_execute", note_kernel_threads)

    shell.events.register("pre_execute", note_kernel_threads)


def _namespace() -> tuple[dict[str, object], set[str]]:
    shell = get_ipython()
    return shell.user_ns, set(shell.user_ns_hidden)


def _user_names(namespace: dict[str, object], hidden: set[str]) -> list[str]:
    """The names the user made: IPython's own (``In``, ``_3``, ``get_ipython``) are not."""
    return [name for name in namespace if not name.startswith("_") and name not in hidden]


def _process_not_kept() -> dict[str, str]:
    """What the process holds beyond its variables, which a variables snapshot loses: the
    user's running threads and the files in /tmp (a memory pause keeps both)."""
    lost: dict[str, str] = {}
    threads = threading.enumerate()
    # No cell has run yet (a snapshot's own evaluation runs none): every thread is the kernel's.
    kernel_threads = {t.ident for t in threads} if _kernel_threads is None else _kernel_threads
    for thread in threads:
        if thread.ident not in kernel_threads and thread is not threading.main_thread():
            lost[f"thread {thread.name!r}"] = "a running thread: a variables snapshot keeps none"
    try:
        entries = sorted(entry for entry in os.listdir(tempfile.gettempdir())
                         if not entry.startswith(KERNEL_TMP_PREFIXES))
    except OSError:
        entries = []
    for entry in entries[:MAX_TMP_LISTED]:
        lost[f"/tmp/{entry}"] = "a file in /tmp: a variables snapshot keeps only the workspace"
    if len(entries) > MAX_TMP_LISTED:
        lost["/tmp"] = f"{len(entries) - MAX_TMP_LISTED} more entries, not kept either"
    return lost


# -- memory ------------------------------------------------------------------------------------

def _read_int(path: str) -> int | None:
    try:
        with open(path, "rb") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None  # "max" (v2, no limit) too


def _memory_files() -> tuple[str, str, str, bytes] | None:
    return next((files for files in CGROUP_FILES if os.path.exists(files[0])), None)


def memory_free() -> int | None:
    """The bytes the sandbox may still take before its limit (reclaimable file cache counted
    free), or None where its cgroup cannot be read or sets no limit."""
    files = _memory_files()
    if files is None:
        return None
    usage, limit = _read_int(files[0]), _read_int(files[1])
    if usage is None or limit is None or limit >= 1 << 60:
        return None
    reclaimable = 0
    try:
        with open(files[2], "rb") as f:
            for line in f:
                name, _, value = line.partition(b" ")
                if name == files[3]:
                    reclaimable = int(value)
    except (OSError, ValueError):
        pass
    return limit - usage + reclaimable


def _check_memory() -> None:
    free = memory_free()
    if free is not None and free < MIN_FREE_BYTES:
        raise SnapshotRefused(
            f"the sandbox has {free >> 20} MiB of memory left, and the snapshot needs "
            f"{MIN_FREE_BYTES >> 20} MiB free to go on; free some (del a large variable) "
            "or raise the profile's memory limit")


def _closed_file(name: str, mode: str, buffered: bool) -> io.IOBase:
    """A closed file object named ``name``, as the one pickled was: made on the null device,
    so that the file of that name is not opened (a ``'w'`` mode would truncate it)."""
    safe = mode.replace("x", "w")  # the null device exists: 'x' would refuse it
    f: Any = open(os.devnull, safe, buffering=-1 if buffered else 0)  # noqa: SIM115
    raw = getattr(f, "buffer", f)  # text: its buffer; buffered: its raw file
    raw = getattr(raw, "raw", raw)
    raw.name = name
    f.close()
    return f  # type: ignore[no-any-return]


class _Pickler(dill.Pickler):  # type: ignore[misc]
    """dill's pickler, but numpy arrays pickle as numpy itself says for protocol 5 (their
    buffer out of band): dill's own hook asks them for protocol 2's form, which copies the
    whole array into one bytes object first. A closed file comes back closed without its file
    being opened, and an open one is opened again without truncation, at its position
    (dill's default reopens it in its mode: ``'w'`` emptied the file at every resume)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, fmode=dill.CONTENTS_FMODE, **kwargs)

    def reducer_override(self, obj: object) -> Any:
        numpy = sys.modules.get("numpy")
        if numpy is not None and type(obj) is numpy.ndarray:
            if obj.dtype.hasobject:
                return plain.reduced(obj, memory_free, MIN_FREE_BYTES) or NotImplemented
            return obj.__reduce_ex__(5)
        if isinstance(obj, io.IOBase) and obj.closed and isinstance(
                getattr(obj, "name", None), str) and isinstance(getattr(obj, "mode", None), str):
            return _closed_file, (obj.name, obj.mode, not isinstance(obj, io.FileIO))
        return NotImplemented


def _sized(namespace: dict[str, object], names: list[str]) -> list[str]:
    """Small values first: a value that cannot be pickled is then met before the large ones
    are written, and the dump that starts again without it costs little."""

    def size(name: str) -> int:
        value = namespace[name]
        nbytes = getattr(value, "nbytes", None)  # numpy arrays
        if isinstance(nbytes, int):
            return nbytes
        if type(value).__module__.startswith("pandas"):
            return 1 << 62  # pandas' own size is slow to ask (it reads every string)
        try:
            return sys.getsizeof(value)
        except Exception:
            return 0

    return sorted(names, key=size)


def save(path: str) -> str:
    """Write the user's variables to ``path`` (a pipe, or a new file); JSON with the names
    kept, what was not, and the bytes written.

    One pickler for all (a pickle per variable, one memo), so objects shared between
    variables stay shared; a value that cannot be pickled (a thread, a socket, a generator)
    is left out with the reason, and the dump starts again without it. What is not a
    variable but is lost all the same (running threads, files in /tmp) is listed too.
    :class:`SnapshotRefused` when the sandbox's memory would run out.
    """
    namespace, hidden = _namespace()
    names = _sized(namespace, _user_names(namespace, hidden))
    lost: dict[str, str] = {}
    _check_memory()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    writer: Writer | None = None
    try:
        writer = Writer(fd, _check_memory)
        while True:
            # Not dill's ``recurse``: it gives each function defined in the session a dict
            # of its own holding the globals it names, as they were at the pause, so that
            # after a resume the function never saw a global rebound again. Without it a
            # function's globals are the namespace itself (``__main__``, by reference).
            pickler = _Pickler(writer, protocol=5, buffer_callback=writer.buffer)
            name = ""
            try:
                for name in names:
                    if name not in lost:
                        pickler.dump((name, namespace[name]))
                break
            except io.UnsupportedOperation as exc:
                # An open pipe's file (dill pickles a file by seeking it): not data, and not
                # the writer's failure, though it is an OSError too.
                lost[name] = f"{type(exc).__name__}: {exc}"[:MAX_REASON]
                writer.void()
            except (SnapshotRefused, OSError):
                raise
            except Exception as exc:
                lost[name] = f"{type(exc).__name__}: {exc}"[:MAX_REASON]
                writer.void()
        writer.end()
    finally:
        if writer is not None:  # its thread is done with the descriptor before it closes
            writer.abandon()
        os.close(fd)
    return json.dumps({"kept": sorted(n for n in names if n not in lost),
                       "not_kept": {**lost, **_process_not_kept()}, "bytes": writer.written})


def load(path: str, reseed: bool) -> str:
    """Put the variables saved in ``path`` (a pipe, or a file, deleted after) back into the
    namespace.

    ``reseed``: a copy of a session (a fork) must not draw the same random numbers as its
    siblings, so the generators of ``random`` and ``numpy.random`` start from fresh entropy.
    """
    try:
        with open(path, "rb") as f:
            values = _load_stream(f)
    finally:
        if not _is_pipe(path):
            os.unlink(path)
    namespace, _hidden = _namespace()
    namespace.update(values)
    if reseed:
        random.seed()
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()
    return json.dumps({"loaded": sorted(values)})


def _is_pipe(path: str) -> bool:
    try:
        return os.stat(path, follow_symlinks=False).st_mode & 0o170000 == 0o010000
    except OSError:
        return False


class _Prefixed:
    """A file whose first bytes were read already (an older snapshot, for dill.load)."""

    def __init__(self, head: bytes, f: Any) -> None:
        self.head, self.f = head, f

    def read(self, size: int = -1) -> bytes:
        if size < 0:
            head, self.head = self.head, b""
            return head + self.f.read()
        head, self.head = self.head[:size], self.head[size:]
        return head + (self.f.read(size - len(head)) if size > len(head) else b"")

    def readline(self) -> bytes:
        if b"\n" in self.head:
            line, _, self.head = self.head.partition(b"\n")
            return line + b"\n"
        head, self.head = self.head, b""
        return head + self.f.readline()

    def readinto(self, target: Any) -> int:
        data = self.read(memoryview(target).nbytes)
        memoryview(target).cast("B")[:len(data)] = data
        return len(data)


def _load_stream(f: Any) -> dict[str, object]:
    head = f.read(len(MAGIC))
    if head != MAGIC:
        values: dict[str, object] = dill.load(_Prefixed(head, f))
        return values
    reader = Reader(f)
    while True:  # once per dump: an ``R`` record voids the one under way
        values = {}
        unpickler = dill.Unpickler(reader, buffers=reader.buffers())
        try:
            while not reader.at_end():
                name, value = unpickler.load()
                values[name] = value
            return values
        except Restart:
            continue
