"""One file operation on the sandbox's own file system, for the gateway: ``python -I -S fsop.py
OP ARG...`` (a ``docker exec`` as the sandbox's user, so it can do what code in the sandbox can,
nothing more).

Operations (paths absolute, normalized by the gateway):

    stat PATH              {"entry": ENTRY}  (a link followed, as E2B's get_info does)
    list PATH DEPTH        {"entries": [ENTRY, ...]}  (depth-first, names sorted)
    mkdir PATH             {"created": BOOL, "entry": ENTRY}  (parents too)
    remove PATH            {}  (a folder with everything in it)
    move SOURCE DEST       {"entry": ENTRY}  (DEST's parents made)
    read PATH LIMIT        one line {"size": N}, then the file's N bytes
    write PATH             stdin is the file's new content; then {"entry": ENTRY}

Every answer is on stdout, one JSON line first; a refusal is ``{"error": KIND, "message": ...}``
(exit status 1), KIND one of ``missing``, ``denied``, ``exists``, ``is_dir``, ``not_dir``,
``no_space``, ``too_large``, ``invalid``, ``failed``. A write stopped by SIGTERM (the upload
broke off or went over its limit) removes the file it created.
"""

import contextlib
import errno
import json
import os
import shutil
import signal
import stat
import sys

CHUNK = 256 * 1024
MAX_ENTRIES = 100_000
"""A listing's entries at most (its JSON answer stays bounded)."""
_KINDS = {errno.ENOENT: "missing", errno.EACCES: "denied", errno.EPERM: "denied",
          errno.EROFS: "denied", errno.EEXIST: "exists", errno.ENOTEMPTY: "exists",
          errno.EISDIR: "is_dir", errno.ENOTDIR: "not_dir", errno.ENOSPC: "no_space",
          errno.EDQUOT: "no_space", errno.EFBIG: "no_space", errno.ELOOP: "invalid",
          errno.ENAMETOOLONG: "invalid", errno.EXDEV: "invalid", errno.EINVAL: "invalid"}


class Refused(Exception):
    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind
        self.message = message


def _answer(data):
    sys.stdout.buffer.write(json.dumps(data).encode() + b"\n")
    sys.stdout.buffer.flush()


def _text(name):
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def _entry(path, follow=True):
    """What is at ``path``; a link followed to what it leads to, described as itself when it
    leads nowhere or loops."""
    info = os.lstat(path)
    target = resolved = None
    if stat.S_ISLNK(info.st_mode):
        target = os.readlink(path)
        if follow:
            with contextlib.suppress(OSError):
                info = os.stat(path)
                resolved = os.path.realpath(path)
    mode = info.st_mode
    kind = ("dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode)
            else "symlink" if stat.S_ISLNK(mode) else "other")
    return {"path": _text(path), "kind": kind, "size": info.st_size, "mode": stat.S_IMODE(mode),
            "modified": info.st_mtime, "target": None if target is None else _text(target),
            "resolved": None if resolved is None else _text(resolved),
            "owner": info.st_uid, "group": info.st_gid}


def op_stat(path):
    return {"entry": _entry(path)}


def op_list(path, depth):
    if not os.path.isdir(path):
        os.stat(path)  # missing: its own error
        raise Refused("not_dir", f"{path!r} is not a folder")
    found = []
    folders = [(path, 1)]
    while folders:  # a stack: depth-first, each folder's entries before the next folder's
        folder, level = folders.pop()
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            if folder == path:
                raise
            continue  # unreadable below the folder asked for: skipped, as ``find`` goes on
        below = []
        for name in names:
            child = os.path.join(folder, name)
            try:
                entry = _entry(child)
            except OSError:
                continue  # gone meanwhile
            found.append(entry)
            if len(found) > MAX_ENTRIES:
                raise Refused("invalid", f"{path!r} holds over {MAX_ENTRIES} entries at depth "
                                         f"{depth}: list a folder further down")
            if entry["kind"] == "dir" and entry["resolved"] is None and level < depth:
                below.append((child, level + 1))
        folders.extend(reversed(below))
    return {"entries": _depth_first(found, path)}


def _depth_first(entries, root):
    """Entries ordered as a walk meets them: each folder followed by what is under it."""
    return sorted(entries, key=lambda e: e["path"][len(root):].lstrip("/").split("/"))


def op_mkdir(path):
    created = True
    try:
        os.makedirs(path)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
        created = False
    return {"created": created, "entry": _entry(path)}


def op_remove(path):
    info = os.lstat(path)
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)
    return {}


def op_move(source, destination):
    os.lstat(source)
    parent = os.path.dirname(destination)
    if parent:
        os.makedirs(parent, exist_ok=True)
    shutil.move(source, destination)  # a rename, or a copy across mounts (the workspace's)
    return {"entry": _entry(destination)}


def op_read(path, limit):
    # O_NONBLOCK: a FIFO does not hang the open; only regular files are read.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    info = os.fstat(fd)
    if stat.S_ISDIR(info.st_mode):
        os.close(fd)
        raise Refused("is_dir", f"{path!r} is a folder")
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise Refused("invalid", f"{path!r} is not a regular file (a device, FIFO or socket): "
                                 "it cannot be downloaded")
    os.set_blocking(fd, True)
    with os.fdopen(fd, "rb", buffering=0) as file:
        if info.st_size > limit:
            raise Refused("too_large", json.dumps({"size": info.st_size, "limit": limit}))
        if info.st_size == 0:
            # /proc and /sys say 0 for what they generate: read it whole, under the limit, in
            # pieces (a sysctl file refuses one read of a size it cannot allocate: ENOMEM).
            pieces, size = [], 0
            while size <= limit and (piece := file.read(min(CHUNK, limit + 1 - size))):
                pieces.append(piece)
                size += len(piece)
            data = b"".join(pieces)
            if len(data) > limit:
                raise Refused("too_large", json.dumps({"size": len(data), "limit": limit}))
            _answer({"size": len(data)})
            sys.stdout.buffer.write(data)
            return
        _answer({"size": info.st_size})
        left = info.st_size  # what it had when opened: a file growing meanwhile is cut there
        while left > 0:
            chunk = file.read(min(CHUNK, left))
            if not chunk:
                break
            sys.stdout.buffer.write(chunk)
            left -= len(chunk)


def op_write(path):
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    existed = os.path.lexists(path)

    def broken_off(_signum, _frame):
        if not existed:
            with contextlib.suppress(OSError):
                os.unlink(path)
        os._exit(143)

    signal.signal(signal.SIGTERM, broken_off)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "wb", buffering=0) as file:
        while True:
            chunk = sys.stdin.buffer.read1(CHUNK)
            if not chunk:
                break
            file.write(chunk)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # written whole: it stays
    return {"entry": _entry(path)}


def main(argv):
    op, args = argv[0], argv[1:]
    try:
        if op == "read":
            op_read(args[0], int(args[1]))
            return 0
        answers = {"stat": op_stat, "list": lambda p, d: op_list(p, int(d)), "mkdir": op_mkdir,
                   "remove": op_remove, "move": op_move, "write": op_write}
        _answer(answers[op](*args))
        return 0
    except Refused as exc:
        _answer({"error": exc.kind, "message": exc.message})
    except OSError as exc:
        name = exc.filename if exc.filename is not None else (args[0] if args else "")
        _answer({"error": _KINDS.get(exc.errno or 0, "failed"),
                 "message": f"{_text(str(name))!r}: {exc.strerror or exc}"})
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
