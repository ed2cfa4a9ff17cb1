"""What the workspace's file API answers and how it reads a path: :class:`FileInfo` and
:class:`Entry`, an API path's components (:func:`split_relative`), and the errors an ``OSError``
on a path becomes."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import PurePosixPath
from typing import Literal

from pydantic import BaseModel

from kernel_pool.exceptions import FileMissing, PathOutsideWorkspace, WorkspaceError, WorkspaceFull


class FileInfo(BaseModel):
    path: str
    size: int
    modified: str


class Entry(BaseModel):
    """A file, folder or link of the workspace, as :meth:`Workspace.stat` sees it."""

    path: str
    """Relative to the workspace; ``""`` is the workspace itself."""
    kind: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: int
    """Permission bits (``st_mode & 0o7777``)."""
    modified: float
    """Seconds since the epoch."""
    target: str | None = None
    """Where a link points: its own text, as the sandbox reads it."""
    resolved: str | None = None
    """For a link followed, the workspace path it leads to; ``kind``, ``size``, ``mode`` and
    ``modified`` are then that entry's. None for a link that leaves the workspace, leads
    nowhere or loops: the entry describes the link itself (``kind`` ``symlink``)."""
    metadata: dict[str, str] | None = None
    """The file's metadata (its ``user.e2b.*`` extended attributes), None if it has none."""


def entry_of(path: str, info: os.stat_result, target: str | None = None, *,
             resolved: str | None = None, metadata: dict[str, str] | None = None) -> Entry:
    kind: Literal["file", "dir", "symlink", "other"] = (
        "dir" if stat.S_ISDIR(info.st_mode) else "file" if stat.S_ISREG(info.st_mode)
        else "symlink" if stat.S_ISLNK(info.st_mode) else "other")
    return Entry(path=_shown(path), kind=kind, size=info.st_size,
                 mode=stat.S_IMODE(info.st_mode), modified=info.st_mtime,
                 target=None if target is None else _shown(target),
                 resolved=None if resolved is None else _shown(resolved), metadata=metadata)


def _shown(name: str) -> str:
    """A file system name as text: bytes that are not UTF-8 as backslash escapes (JSON cannot
    carry them)."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def split_relative(path: str) -> list[str]:
    """Validate an API path (relative, no ``..``) and return its components."""
    if not path or "\x00" in path or "\\" in path or path.startswith("/"):
        raise PathOutsideWorkspace(path)
    parts = [p for p in PurePosixPath(path).parts if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts):
        raise PathOutsideWorkspace(path)
    return parts


def path_error(exc: OSError, path: str) -> WorkspaceError:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EXDEV):
        return PathOutsideWorkspace(path)
    if exc.errno == errno.ENOENT:
        return FileMissing(path)
    if exc.errno == errno.EEXIST:
        return WorkspaceError(f"{path!r} already exists")
    if exc.errno == errno.ENOTEMPTY:
        return WorkspaceError(f"{path!r} is a folder that is not empty")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return WorkspaceFull()
    if exc.errno == errno.EISDIR:
        return WorkspaceError(f"{path!r} is a directory")
    return WorkspaceError(f"{path!r}: {exc.strerror}")
