"""The files an execution created, modified or deleted in the workspace, told in its reply.

The kernel wraps each ``execute_request``: before the code runs it forgets what happened in the
workspace since the last one (uploads, shell commands), after it lists what changed, in the
``execute_reply``'s metadata under :data:`METADATA_KEY` (no extra message). The gateway checks
and bounds the list again; the kernel is not trusted.

Changes are seen through inotify: one watch per folder, set up once when the kernel starts, so
an execution costs nothing per file in the workspace, only per change it made. Where inotify is
not available (the host's ``max_user_instances`` or ``max_user_watches`` used up by other
sandboxes, or its fd closed by user code) it falls back to comparing snapshots of sizes and
mtimes taken before and after, which costs a walk of the workspace per execution
(``bench/files_touched.py`` measures both).

The gateway's own files (``.replgate/``: spilled outputs) are not reported. Folders are not
listed, only files, except a folder moved away as a whole, reported as one deleted path.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import os
import signal
import stat
import struct
import sys
from collections.abc import Callable, Iterator
from typing import Any

METADATA_KEY = "replgate_files"
MAX_REPORTED = 1000
"""Changes listed per execution; past it the list is cut and ``truncated`` set."""
MAX_TRACKED = 20_000
"""Paths followed during one execution; past it only the first are reported (truncated)."""
MAX_SNAPSHOT = 5_000
"""Files the fallback compares (two walks of 5,000 files cost 0.1 to 0.3 s in a one-CPU sandbox,
bench/files_touched.py); past it, it gives up and reports an empty, truncated list."""
IGNORED = ".replgate"

_IN_MODIFY = 0x002
_IN_ATTRIB = 0x004
_IN_CLOSE_WRITE = 0x008
_IN_MOVED_FROM = 0x040
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_Q_OVERFLOW = 0x4000
_IN_IGNORED = 0x8000
_IN_ISDIR = 0x40000000
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
_MASK = (_IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_MOVED_FROM | _IN_MOVED_TO
         | _IN_CREATE | _IN_DELETE | _IN_DELETE_SELF)
_GONE = _IN_DELETE | _IN_MOVED_FROM
_NEW = _IN_CREATE | _IN_MOVED_TO
_HEADER = struct.Struct("iIII")


class _Changes:
    """Per path: did it exist before the execution, does it exist now."""

    def __init__(self) -> None:
        self.first: dict[str, bool] = {}
        self.now: dict[str, bool] = {}
        self.truncated = False

    def add(self, path: str, existed: bool, exists: bool) -> None:
        if path not in self.first:
            if len(self.first) >= MAX_TRACKED:
                self.truncated = True
                return
            self.first[path] = existed
        self.now[path] = exists

    def report(self, root: str) -> dict[str, Any]:
        files = []
        for path, existed in self.first.items():
            exists = self.now[path]
            if not existed and not exists:
                continue
            size: int | None = None
            if exists:
                try:
                    info = os.lstat(os.path.join(root, path))
                except OSError:
                    exists = False
                else:
                    if stat.S_ISDIR(info.st_mode):
                        continue
                    size = info.st_size
            if not existed and not exists:
                continue
            change = "modified" if existed and exists else "created" if exists else "deleted"
            files.append({"path": path, "size": size, "change": change})
        files.sort(key=lambda item: item["path"])
        truncated = self.truncated or len(files) > MAX_REPORTED
        return {"files": files[:MAX_REPORTED], "truncated": truncated}


class InotifyTracker:
    """Follows the workspace with one inotify watch per folder."""

    def __init__(self, root: str) -> None:
        self.root = root
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._add = libc.inotify_add_watch
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self.fd = fd
        self._dirs: dict[int, str] = {}
        self._changes = _Changes()
        try:
            self._watch_tree("", None)
        except OSError:
            os.close(fd)
            raise

    def _watch(self, relative: str) -> None:
        wd = self._add(self.fd, os.fsencode(os.path.join(self.root, relative)), _MASK)
        if wd < 0:
            code = ctypes.get_errno()
            if code in (errno.ENOENT, errno.ENOTDIR, errno.EACCES):
                return  # gone already, or not ours to read: nothing to follow there
            raise OSError(code, f"inotify_add_watch failed: {os.strerror(code)}")
        self._dirs[wd] = relative

    def _watch_tree(self, relative: str, created: _Changes | None) -> None:
        """Watch a folder and those under it; with ``created``, record its files as new
        (made before the watch could see them)."""
        for path, entry in _walk(self.root, relative, self._watch):
            if created is not None and not entry.is_dir(follow_symlinks=False):
                created.add(path, False, True)

    def start(self) -> None:
        """Forget what changed until now (between executions: not the next one's doing)."""
        self._changes = _Changes()
        self._drain(_Changes())

    def finish(self) -> dict[str, Any]:
        self._drain(self._changes)
        return self._changes.report(self.root)

    def _drain(self, changes: _Changes) -> None:
        while True:
            try:
                data = os.read(self.fd, 256 * 1024)
            except BlockingIOError:
                return
            if not data:
                return
            self._parse(data, changes)

    def _parse(self, data: bytes, changes: _Changes) -> None:
        offset = 0
        while offset + _HEADER.size <= len(data):
            wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
            raw = data[offset + _HEADER.size : offset + _HEADER.size + length]
            offset += _HEADER.size + length
            if mask & _IN_Q_OVERFLOW:
                changes.truncated = True
                continue
            folder = self._dirs.get(wd)
            if folder is None:
                continue
            if mask & (_IN_IGNORED | _IN_DELETE_SELF):
                self._dirs.pop(wd, None)
                continue
            name = os.fsdecode(raw.rstrip(b"\0"))
            path = os.path.join(folder, name) if folder else name
            if path == IGNORED or path.startswith(IGNORED + "/"):
                continue
            if mask & _IN_ISDIR:
                if mask & _NEW:
                    self._watch_tree(path, changes)
                elif mask & _IN_MOVED_FROM:
                    changes.add(path, True, False)
                continue
            if mask & _NEW:
                changes.add(path, False, True)
            elif mask & _GONE:
                changes.add(path, True, False)
            else:
                changes.add(path, True, True)


class SnapshotTracker:
    """The fallback: sizes and mtimes of every file, before and after."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._before: dict[str, tuple[int, int]] = {}
        self._cut = False

    def _snapshot(self) -> tuple[dict[str, tuple[int, int]], bool]:
        found: dict[str, tuple[int, int]] = {}
        for path, entry in _walk(self.root, "", None):
            try:
                if entry.is_dir(follow_symlinks=False):
                    continue
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            found[path] = (info.st_mtime_ns, info.st_size)
            if len(found) >= MAX_SNAPSHOT:
                return found, True
        return found, False

    def start(self) -> None:
        self._before, self._cut = self._snapshot()

    def finish(self) -> dict[str, Any]:
        after, cut = self._snapshot()
        changes = _Changes()
        changes.truncated = self._cut or cut
        for path, seen in after.items():
            old = self._before.get(path)
            if old is None:
                changes.add(path, False, True)
            elif old != seen:
                changes.add(path, True, True)
        for path in self._before.keys() - after.keys():
            changes.add(path, True, False)
        return changes.report(self.root)


def _walk(root: str, start: str, on_folder: Callable[[str], None] | None,
          ) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """(relative path, entry) of everything under ``start``, folders included, but the
    gateway's own; ``on_folder`` is called with each folder before it is listed."""
    stack = [start]
    while stack:
        folder = stack.pop()
        if on_folder is not None:
            on_folder(folder)
        try:
            entries = list(os.scandir(os.path.join(root, folder)))
        except OSError:
            continue
        for entry in entries:
            path = os.path.join(folder, entry.name) if folder else entry.name
            if path == IGNORED:
                continue
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False):
                    stack.append(path)
            yield path, entry


def tracker(root: str) -> InotifyTracker | SnapshotTracker:
    """inotify where the host allows it, else snapshots."""
    try:
        return InotifyTracker(root)
    except (OSError, AttributeError):
        return SnapshotTracker(root)


def install(kernel: Any, root: str) -> None:
    """Report each execution's changes in its execute_reply metadata."""
    tracking = tracker(root)
    state = {"tracker": tracking, "running": False}
    init_metadata, finish_metadata = kernel.init_metadata, kernel.finish_metadata

    def init(parent: Any) -> Any:
        metadata = init_metadata(parent)
        state["running"] = _is_execute(parent)
        if state["running"]:
            with contextlib.suppress(Exception):
                _start(state)
        return metadata

    def finish(parent: Any, metadata: Any, reply_content: Any) -> Any:
        metadata = finish_metadata(parent, metadata, reply_content)
        if state["running"] and isinstance(metadata, dict):
            state["running"] = False
            try:
                metadata[METADATA_KEY] = state["tracker"].finish()  # type: ignore[union-attr]
            except Exception:  # e.g. its fd closed by user code: walk snapshots from now on
                state["tracker"] = SnapshotTracker(root)
                metadata[METADATA_KEY] = {"files": [], "truncated": True}
        return metadata

    kernel.init_metadata, kernel.finish_metadata = init, finish


def _start(state: dict[str, Any]) -> None:
    try:
        state["tracker"].start()
    except OSError:
        state["tracker"] = SnapshotTracker(state["tracker"].root)
        state["tracker"].start()


def _is_execute(parent: Any) -> bool:
    header = parent.get("header") if isinstance(parent, dict) else None
    return isinstance(header, dict) and header.get("msg_type") == "execute_request"


def serve(root: str, fifo: str) -> None:
    """Track ``root`` for a kernel that cannot (R's, ``irkernel.R``), as its child: make the
    FIFO ``fifo``, say ``ready`` on stdout, then answer each line read from the FIFO:
    ``start`` (an execution starts: forget what changed until now) with ``started``,
    ``finish`` with that execution's changes as one JSON line. Ends when the kernel closes
    the FIFO."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the interrupt of R, sent to its group
    with contextlib.suppress(FileNotFoundError):
        os.unlink(fifo)
    os.mkfifo(fifo, 0o600)
    state: dict[str, Any] = {"tracker": tracker(root)}
    print("ready", flush=True)
    with open(fifo, encoding="utf-8") as requests:
        for line in requests:
            if line == "start\n":
                with contextlib.suppress(Exception):
                    _start(state)
                print("started", flush=True)
            elif line == "finish\n":
                try:
                    report = state["tracker"].finish()
                except Exception:  # as install's: walk snapshots from now on
                    state["tracker"] = SnapshotTracker(root)
                    report = {"files": [], "truncated": True}
                print(json.dumps(report), flush=True)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
