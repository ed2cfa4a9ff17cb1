"""A variables snapshot's stream (see :mod:`replgate_kernel.snapshot`): :data:`MAGIC`, then
records, each a kind and a length (:data:`HEADER`) and its bytes:

- ``P``: pickle bytes;
- ``B``: one out-of-band buffer, always before the pickle bytes that use it;
- ``R``: what came before is void (a value could not be pickled; the dump starts again
  without it);
- ``E``: the end.
"""

import array
import ctypes
import errno
import fcntl
import os
import pickle
import queue
import stat
import struct
import sys
import termios
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

MAGIC = b"RGSNAP2\n"
HEADER = struct.Struct(">cQ")
CHUNK = 1 << 20
"""Pickle bytes are gathered up to this size before they are written."""
QUEUED_RECORDS = 8
"""Records the pickler may be ahead of the stream's writing by."""


SPLICED_MIN = 1 << 16
"""Out-of-band buffers at least this large go into a pipe by reference (``vmsplice``):
the host's ``splice`` then makes the one copy, into its file, at half the time of a write
here and a splice there (1 GiB: 0.3 s against 0.6 s)."""
DRAIN_WAIT_S = 60.0
"""How long the end waits for the host to read what is still in the pipe."""


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data):]


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _libc_vmsplice() -> Any:
    try:
        function = ctypes.CDLL(None, use_errno=True).vmsplice
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_size_t, ctypes.c_uint)
    function.restype = ctypes.c_ssize_t
    return function


_vmsplice = _libc_vmsplice()


def _address(data: memoryview) -> int | None:
    """Where a contiguous buffer's bytes are (numpy reads it, read-only ones too; without
    numpy loaded, no out-of-band buffer is large anyway)."""
    numpy = sys.modules.get("numpy")
    if numpy is None:
        return None
    return int(numpy.frombuffer(data, numpy.uint8).ctypes.data)


def _spliced(fd: int, data: memoryview) -> int:
    """Put ``data`` into the pipe ``fd`` by reference; how many bytes went (fewer than all
    when ``vmsplice`` refuses: the caller writes the rest)."""
    address = _address(data)
    if address is None or _vmsplice is None:
        return 0
    done, vector = 0, _IoVec()
    while done < data.nbytes:
        vector.base, vector.len = address + done, data.nbytes - done
        moved = _vmsplice(fd, ctypes.byref(vector), 1, 0)
        if moved < 0:
            error = ctypes.get_errno()
            if error == errno.EPIPE:  # the reader is gone, as a write would say
                raise BrokenPipeError(error, os.strerror(error))
            return done  # not offered here (ENOSYS, EINVAL): written instead
        done += moved
    return done


def _unread(fd: int) -> int:
    """Bytes in the pipe ``fd`` that its reader has not taken yet."""
    count = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, count)
    return count[0]


class Writer:
    """The stream's writing end: what the pickler writes, and its out-of-band buffers.

    The records are written by a thread of their own, in order, while the pickler goes on:
    the pickling of the next values (a million strings take a fifth of a second) then runs
    while a large array's bytes go down the pipe, not after them. At most
    :data:`QUEUED_RECORDS` wait: each is a view of a value's own memory, a copy of at most
    :data:`CHUNK` bytes, or a plain array's pickle (see ``plain``, which counts the memory
    taken when it makes one). ``check`` is called before each record is queued: it raises to
    stop the dump (the sandbox's memory running out).
    """

    def __init__(self, fd: int, check: Callable[[], None]) -> None:
        self.fd = fd
        self._check = check
        self.pending = bytearray()
        self.written = 0
        self._pipe = stat.S_ISFIFO(os.fstat(fd).st_mode)
        self._sent = 0  # bytes put into ``fd``
        # Buffers put into the pipe by reference, with where they end in the stream: their
        # memory must stay as it is (and alive) until the host has read them.
        self._lent: deque[tuple[int, memoryview, pickle.PickleBuffer]] = deque()
        self._queue: queue.Queue[tuple[bytes, Any, pickle.PickleBuffer | None] | None] = \
            queue.Queue(QUEUED_RECORDS)
        self._failure: Exception | None = None
        self._stopped = False
        self._thread = threading.Thread(target=self._drain, name="replgate-snapshot",
                                        daemon=True)
        self._thread.start()
        self._put(b"", memoryview(MAGIC))

    def _drain(self) -> None:
        while (item := self._queue.get()) is not None:
            kind, data, buffer = item
            try:
                if self._failure is None and not self._stopped:
                    if kind:
                        _write_all(self.fd, memoryview(HEADER.pack(kind, data.nbytes)))
                        self._sent += HEADER.size
                    self._lend(data, buffer)
                    self._sent += data.nbytes
                    self._give_back(self._sent - _unread(self.fd) if self._lent else 0)
            except Exception as exc:  # the reader gone (EPIPE), most likely
                self._failure = exc  # the next record put, or the end, raises it
            finally:
                # One lent (even in part) is released once read, or at the end.
                if buffer is not None and not (self._lent and self._lent[-1][2] is buffer):
                    self._release(data, buffer)
        self._settle()

    def _lend(self, data: memoryview, buffer: pickle.PickleBuffer | None) -> None:
        """Write ``data``, by reference into a pipe if it is a large buffer (then noted in
        ``_lent``: its release waits for the host to read it)."""
        moved = 0
        if buffer is not None and self._pipe and data.nbytes >= SPLICED_MIN:
            moved = _spliced(self.fd, data)
            if moved:
                self._lent.append((self._sent + moved, data, buffer))
        _write_all(self.fd, data[moved:])

    def _give_back(self, read: int) -> None:
        """Release the lent buffers the host has read (``read``: bytes of the stream)."""
        while self._lent and self._lent[0][0] <= read:
            _, data, buffer = self._lent.popleft()
            self._release(data, buffer)

    def _settle(self) -> None:
        """At the end: wait for the host to read what it was lent, then release it. If it
        does not, the dump fails (it is void then, whatever the host reads later)."""
        deadline = time.monotonic() + DRAIN_WAIT_S
        try:
            while self._lent and self._failure is None and not self._stopped:
                if _unread(self.fd) == 0:
                    break
                if time.monotonic() > deadline:
                    self._failure = TimeoutError("the host did not read the snapshot")
                    break
                time.sleep(0.001)
        except OSError as exc:
            self._failure = self._failure or exc
        finally:
            self._give_back(self._sent)

    @staticmethod
    def _release(data: memoryview, buffer: pickle.PickleBuffer) -> None:
        # The pickler's memo keeps the reduce tuple holding this buffer to the dump's end:
        # released, it no longer keeps its object (a plain array's pickle) alive that long.
        data.release()
        buffer.release()

    def _put(self, kind: bytes, data: Any, buffer: pickle.PickleBuffer | None = None) -> None:
        """Queue a record (``kind`` empty: bytes without a header), or raise what the
        writing thread met."""
        if self._failure is not None:
            raise self._failure
        self._queue.put((kind, data, buffer))
        if kind:
            self.written += data.nbytes

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if view.nbytes >= CHUNK:  # a large bytes value: straight from its own memory
            self.flush()
            self._check()
            self._put(b"P", view)
        else:
            self.pending += view
            if len(self.pending) >= CHUNK:
                self.flush()
        return view.nbytes

    def flush(self) -> None:
        if self.pending:
            self._check()
            pending, self.pending = self.pending, bytearray()
            self._put(b"P", memoryview(pending))

    def buffer(self, buffer: pickle.PickleBuffer) -> bool:
        """The pickler's ``buffer_callback``: the buffer goes out of band (False)."""
        self.flush()
        self._check()
        self._put(b"B", buffer.raw(), buffer)
        return False

    def void(self) -> None:
        """What was written so far is void: the dump starts again."""
        self.pending.clear()
        self._put(b"R", memoryview(b""))

    def end(self) -> None:
        """Write the end and wait until every record is written."""
        self.flush()
        self._put(b"E", memoryview(b""))
        self.close()
        if self._failure is not None:
            raise self._failure

    def close(self) -> None:
        """Stop the writing thread once it has written what is queued (dropped instead
        after :meth:`abandon`), and wait for it: a record under way is written to its end
        (or fails, the reader gone)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def abandon(self) -> None:
        """The dump failed: drop what is queued, and stop the thread."""
        self._stopped = True
        self.close()


class Restart(Exception):
    """The stream says what came before is void (an ``R`` record)."""


class Reader:
    """The stream's reading end, as a file for the unpickler; out-of-band buffers are read
    into memory of their own as they come (:meth:`buffers` hands them over in order)."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.left = 0  # of the current pickle record
        self.queued: deque[bytearray] = deque()
        self.ended = False

    def _exact(self, size: int) -> bytes:
        data = self.f.read(size)
        if len(data) != size:
            raise EOFError("the snapshot ends early")
        return bytes(data)

    def _next_record(self) -> None:
        """Read records until pickle bytes come (or the end); buffers are queued."""
        while self.left == 0 and not self.ended:
            kind, size = HEADER.unpack(self._exact(HEADER.size))
            if kind == b"P":
                self.left = size
            elif kind == b"B":
                buffer = bytearray(size)
                view, got = memoryview(buffer), 0
                while got < size:
                    n = self.f.readinto(view[got:])
                    if not n:
                        raise EOFError("the snapshot ends early")
                    got += n
                self.queued.append(buffer)
            elif kind == b"R":
                self.queued.clear()
                raise Restart
            elif kind == b"E":
                self.ended = True
            else:
                raise ValueError(f"the snapshot is corrupt (record {kind!r})")

    def read(self, size: int = -1) -> bytes:
        out = bytearray()
        while size < 0 or len(out) < size:
            self._next_record()
            if self.left == 0:
                break
            want = self.left if size < 0 else min(self.left, size - len(out))
            out += self._exact(want)
            self.left -= want
        return bytes(out)

    def readinto(self, target: Any) -> int:
        view = memoryview(target).cast("B")
        done = 0
        while done < view.nbytes:
            self._next_record()
            if self.left == 0:
                break
            want = min(self.left, view.nbytes - done)
            n = self.f.readinto(view[done:done + want])
            if not n:
                raise EOFError("the snapshot ends early")
            done += n
            self.left -= n
        return done

    def readline(self) -> bytes:
        out = bytearray()
        while not out.endswith(b"\n"):
            piece = self.read(1)
            if not piece:
                break
            out += piece
        return bytes(out)

    def at_end(self) -> bool:
        """Whether the stream's end came (not within a pickle: between two)."""
        self._next_record()
        return self.ended

    def buffers(self) -> Any:
        while True:
            while not self.queued:  # never expected: a buffer comes before its use
                if self.ended:
                    raise ValueError("the snapshot is corrupt (a buffer is missing)")
                pending = self.left
                self.left = 0
                if pending:
                    raise ValueError("the snapshot is corrupt (a buffer comes late)")
                self._next_record()
            yield self.queued.popleft()
