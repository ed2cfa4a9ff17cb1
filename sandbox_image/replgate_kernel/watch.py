"""Watch a folder for the gateway: ``python -I -S watch.py FOLDER RECURSIVE RESCAN`` (a
``docker exec``).

Linux's inotify, through ctypes (no package). One JSON line per event on stdout, in the order
the kernel queued them: ``{"type": "create"|"write"|"remove"|"rename"|"chmod", "name": path
relative to FOLDER, "is_dir": bool, "entry": {...} | null}`` (``entry``: the path's ``lstat``
when it still exists, so a client needs no second look). The events are fsnotify's, as E2B's
envd reports them: a file created or moved in is ``create``, written or truncated ``write``,
its mode or owner changed ``chmod``, deleted ``remove``, moved away ``rename``.

The first line is ``{"type": "ready"}``, once every watch is in place (a change made after it
is seen), or ``{"type": "error", "kind": "missing"|"not_dir", ...}`` before exiting. With
RECURSIVE ``1`` every folder below is watched, and a folder created or moved in later is watched
as soon as its event is read; what was made in it before that is reported then as ``create``
(and ``write`` for a file with content), so nothing made in a new folder goes unseen (its own
``create``, read after that, is not reported again). SIGUSR1
asks for a ``{"type": "sync"}`` line once every event queued before it was written (the gateway
asks before answering a poll, so a change it made just before is in the answer). The last line
is ``{"type": "end", "reason": ...}`` when FOLDER itself goes or the kernel's queue overflowed.

With RESCAN ``1`` (gVisor: its inotify sees only the changes made inside the sandbox, not
those the gateway makes in the workspace from the host) the watched folders are also rescanned
every :data:`RESCAN_S` and before each ``sync``, and what changed since the last look, or since
an inotify event about it, is reported as the events fsnotify would have given.
"""

import contextlib
import ctypes
import ctypes.util
import errno
import json
import os
import select
import signal
import stat
import struct
import sys
import time

IN_MODIFY, IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO = 0x2, 0x4, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF = 0x100, 0x200, 0x400, 0x800
IN_Q_OVERFLOW, IN_IGNORED, IN_ONLYDIR, IN_DONT_FOLLOW = 0x4000, 0x8000, 0x1000000, 0x2000000
IN_ISDIR, IN_NONBLOCK, IN_CLOEXEC = 0x40000000, 0o4000, 0o2000000
MASK = (IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
        | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW)
KINDS = ((IN_CREATE | IN_MOVED_TO, "create"), (IN_MODIFY, "write"), (IN_ATTRIB, "chmod"),
         (IN_DELETE, "remove"), (IN_MOVED_FROM, "rename"))
HEADER = struct.Struct("iIII")
RESCAN_S = 1.0

libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def emit(line: dict) -> None:
    sys.stdout.write(json.dumps(line, separators=(",", ":")) + "\n")


def entry(path: str) -> dict | None:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    mode = info.st_mode
    kind = ("dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode)
            else "symlink" if stat.S_ISLNK(mode) else "other")
    target = None
    if kind == "symlink":
        with contextlib.suppress(OSError):
            target = os.readlink(path)
    return {"kind": kind, "size": info.st_size, "mode": stat.S_IMODE(mode),
            "modified": info.st_mtime, "target": target}


def facts(info: dict) -> tuple:
    return info["kind"], info["size"], info["modified"], info["mode"]


class Watcher:
    def __init__(self, root: str, recursive: bool) -> None:
        self.root = root
        self.recursive = recursive
        self.fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.folders: dict[int, str] = {}
        """Watch descriptor -> its folder, relative to the root (``""``: the root)."""
        self.announced: set[str] = set()
        """Paths reported as found in a new folder, whose own ``create`` may still come."""
        self.seen: dict[str, tuple] | None = None
        """With rescans: each path below the root as last seen (kind, size, mtime, mode)."""

    def add(self, relative: str) -> int:
        path = os.path.join(self.root, relative) if relative else self.root
        wd = libc.inotify_add_watch(self.fd, os.fsencode(path), MASK)
        if wd < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), path)
        self.folders[wd] = relative
        return wd

    def add_tree(self, relative: str, announce: bool) -> None:
        """Watch a folder and every folder below it; with ``announce`` report what is in them
        (made before its watch was in place)."""
        try:
            self.add(relative)
        except OSError:  # gone again, or not a folder any more: its own events said so
            return
        try:
            names = sorted(os.listdir(os.path.join(self.root, relative)))
        except OSError:
            return
        for name in names:
            child = os.path.join(relative, name) if relative else name
            info = entry(os.path.join(self.root, child))
            if info is None:
                continue
            is_dir = info["kind"] == "dir"
            if announce:
                self.announced.add(child)
                self.report("create", child, is_dir, info)
                if info["kind"] == "file" and info["size"]:
                    self.report("write", child, False, info)
            if is_dir:
                self.add_tree(child, announce)

    def report(self, kind: str, name: str, is_dir: bool, info: dict | None) -> None:
        if self.seen is not None:  # a rescan must not report it again
            if info is None:
                self.forget(name)
            else:
                self.seen[name] = facts(info)
        emit({"type": kind, "name": name, "is_dir": is_dir, "entry": info})

    def forget(self, name: str) -> None:
        assert self.seen is not None
        self.seen.pop(name, None)
        for path in [p for p in self.seen if p.startswith(name + "/")]:
            del self.seen[path]

    def scan(self) -> dict[str, dict]:
        """Every path below the root (or in it alone, not recursive), with its ``entry``."""
        found: dict[str, dict] = {}
        folders = [""]
        while folders:
            folder = folders.pop()
            try:
                names = sorted(os.listdir(os.path.join(self.root, folder)))
            except OSError:
                continue
            for name in names:
                child = os.path.join(folder, name) if folder else name
                info = entry(os.path.join(self.root, child))
                if info is not None:
                    found[child] = info
                    if info["kind"] == "dir" and self.recursive:
                        folders.append(child)
        return found

    def made_outside(self, name: str) -> None:
        """Report a path made from the host that the rescans have not seen yet."""
        info = entry(os.path.join(self.root, name))
        if info is not None:
            self.report("create", name, info["kind"] == "dir", info)
            if info["kind"] == "file" and info["size"]:
                self.report("write", name, False, info)

    def rescan(self) -> None:
        """Report what changed since the last look (gVisor: changes made from the host)."""
        assert self.seen is not None
        found = self.scan()
        for name in [p for p in self.seen if p not in found]:
            if name in self.seen:  # not forgotten with its folder already
                was_dir = self.seen[name][0] == "dir"
                self.report("remove", name, was_dir, None)
        for name in sorted(found):
            info, before = found[name], self.seen.get(name)
            is_dir = info["kind"] == "dir"
            if before is None:
                self.made_outside(name)
                if is_dir and self.recursive:
                    with contextlib.suppress(OSError):
                        self.add(name)
            elif before[0] != info["kind"]:
                self.report("remove", name, before[0] == "dir", None)
                self.report("create", name, is_dir, info)
            else:
                if before[3] != info["mode"]:
                    self.report("chmod", name, is_dir, info)
                if not is_dir and before[1:3] != (info["size"], info["modified"]):
                    self.report("write", name, False, info)

    def read(self) -> str | None:
        """Report what is queued now; why the watch ended, if it did."""
        while True:
            try:
                data = os.read(self.fd, 256 * 1024)
            except BlockingIOError:
                # Every event queued before a new folder was listed has been read by now.
                self.announced.clear()
                return None
            offset = 0
            while offset < len(data):
                wd, mask, _cookie, size = HEADER.unpack_from(data, offset)
                offset += HEADER.size
                name = data[offset:offset + size].rstrip(b"\0").decode("utf-8", "surrogateescape")
                offset += size
                if mask & IN_Q_OVERFLOW:
                    return "overflow: events came faster than they were read"
                folder = self.folders.get(wd)
                if folder is None:
                    continue
                if mask & IN_IGNORED:
                    del self.folders[wd]
                    if not folder:
                        return "the watched folder was removed"
                    continue
                if not name:  # the folder's own deletion or move: its parent reports it
                    if not folder and mask & (IN_DELETE_SELF | IN_MOVE_SELF):
                        return ("the watched folder was removed" if mask & IN_DELETE_SELF
                                else "the watched folder was moved")
                    continue
                child = os.path.join(folder, name) if folder else name
                is_dir = bool(mask & IN_ISDIR)
                if child in self.announced:  # its create was reported with its folder's
                    self.announced.discard(child)
                    mask &= ~IN_CREATE
                if (self.seen is not None and child not in self.seen
                        and not mask & (IN_CREATE | IN_MOVED_TO | IN_DELETE | IN_MOVED_FROM)):
                    self.made_outside(child)
                for bits, kind in KINDS:
                    if mask & bits:
                        info = (None if kind in ("remove", "rename")
                                else entry(os.path.join(self.root, child)))
                        self.report(kind, child, is_dir, info)
                if is_dir and self.recursive and mask & (IN_CREATE | IN_MOVED_TO):
                    self.add_tree(child, announce=True)


def main() -> int:
    root, recursive = os.path.realpath(sys.argv[1]), sys.argv[2] == "1"
    rescans = len(sys.argv) > 3 and sys.argv[3] == "1"
    wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGUSR1, lambda _signum, _frame: None)
    watcher = Watcher(root, recursive)
    try:
        watcher.add("")
    except OSError as exc:
        kind = "missing" if exc.errno == errno.ENOENT else "not_dir"
        emit({"type": "error", "kind": kind, "message": exc.strerror})
        return 1
    if recursive:
        for name in sorted(os.listdir(root)):
            if os.path.isdir(os.path.join(root, name)) and not os.path.islink(
                    os.path.join(root, name)):
                watcher.add_tree(name, announce=False)
    if rescans:
        watcher.seen = {name: facts(info) for name, info in watcher.scan().items()}
    rescanned = time.monotonic()
    emit({"type": "ready"})
    sys.stdout.flush()
    while True:
        try:
            readable, _, _ = select.select([watcher.fd, wake_read], [], [],
                                           RESCAN_S if rescans else None)
        except InterruptedError:
            continue
        synced = False
        if wake_read in readable:
            with contextlib.suppress(BlockingIOError):
                synced = signal.SIGUSR1 in os.read(wake_read, 64)
        ended = watcher.read()
        if ended is None and rescans and not os.path.isdir(root):
            ended = "the watched folder was removed"
        if ended is None and rescans and (synced or time.monotonic() - rescanned >= RESCAN_S):
            watcher.rescan()
            rescanned = time.monotonic()
        if ended is not None:
            emit({"type": "end", "reason": ended})
            sys.stdout.flush()
            return 0
        if synced:
            emit({"type": "sync"})
        sys.stdout.flush()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # the gateway stopped reading: the watch is over
        sys.exit(0)
