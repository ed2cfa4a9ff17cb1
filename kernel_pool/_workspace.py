"""A session's workspace: a host folder, capped in size, bind-mounted at ``/home/user``.

As root, each workspace is its own small ext4 filesystem on a file whose blocks are reserved at
creation, loop-mounted with nosuid,nodev, so a full disk inside one sandbox is that sandbox's
problem alone, and a full host disk refuses new workspaces instead of failing running ones.
Without root the folder is a plain directory and the size cap is not enforced (a warning says so).

A paused session's workspace is *parked*: unmounted (no mount, no loop device), its image holding
only the blocks its files and metadata use, the rest punched out and given back to the host.
Its files stay reachable: each file operation mounts it for its own duration (read-only for a
read), and one that writes reserves the full size again first, so no write ever lands on blocks
the host has not given. Resuming reserves it and mounts it for good; a host disk that cannot give
the blocks back refuses that with :class:`StateDirFull`, and the parked image is left as it was.

Every file operation here resolves the path one component at a time with ``O_NOFOLLOW``
relative to the workspace's own descriptor, so neither ``..``, absolute paths nor symlinks
(even ones the sandboxed code swaps in mid-request) can reach outside.
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Concatenate, ParamSpec, TypeVar

from kernel_pool._disk import SANDBOX_GID, SANDBOX_UID, WorkspaceDisk
from kernel_pool._entries import Entry, FileInfo, entry_of, path_error, split_relative
from kernel_pool._links import resolve
from kernel_pool._metadata import check_metadata, read_metadata, replace_metadata
from kernel_pool.exceptions import FileTooLarge, PathOutsideWorkspace, WorkspaceError

P = ParamSpec("P")
T = TypeVar("T")

SANDBOX_PATH = "/home/user"
"""Where the workspace is in the sandbox, every kernel's and command's working folder: E2B's
(code written for it names its files there and expects ``os.getcwd()`` to say so)."""
OLD_SANDBOX_PATH = "/workspace"
"""Where the workspace was before: the image links it to :data:`SANDBOX_PATH`, and a command's
``cwd`` may still name it."""


def _mounted(write: bool) -> Callable[[Callable[Concatenate[Workspace, P], T]],
                                     Callable[Concatenate[Workspace, P], T]]:
    """A file operation of :class:`Workspace`, run with the workspace mounted (see
    :meth:`Workspace.access`)."""
    def decorate(method: Callable[Concatenate[Workspace, P], T]
                 ) -> Callable[Concatenate[Workspace, P], T]:
        @functools.wraps(method)
        def run(self: Workspace, /, *args: P.args, **kwargs: P.kwargs) -> T:
            with self.access(write):
                return method(self, *args, **kwargs)
        return run
    return decorate


class Workspace(WorkspaceDisk):
    """A workspace folder on the host. Blocking I/O: call from a worker thread."""

    @contextmanager
    def _parent_fd(self, parts: list[str], create: bool) -> Iterator[int]:
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for part in parts[:-1]:
                if create:
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                        self._own(part, fd)
                    except FileExistsError:
                        pass
                try:
                    child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                except OSError as exc:
                    raise path_error(exc, "/".join(parts)) from exc
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)

    @staticmethod
    def _own(name: str, dir_fd: int) -> None:
        if os.geteuid() == 0:
            os.chown(name, SANDBOX_UID, SANDBOX_GID, dir_fd=dir_fd, follow_symlinks=False)

    @_mounted(write=True)
    def write_bytes(self, path: str, data: bytes,
                    metadata: dict[str, str] | None = None) -> int:
        """Create or replace a file, through links on its path while they lead to what is
        inside the workspace; ``metadata`` becomes its only metadata (a write without clears
        what an earlier one set). A refused ``metadata`` leaves no file."""
        checked = check_metadata(metadata)
        try:
            self._write(path, data, os.O_TRUNC, metadata=checked, replace=True)
        except PathOutsideWorkspace:
            parts = split_relative(path)
            leads_to = resolve(parts, self._lookup, (SANDBOX_PATH, OLD_SANDBOX_PATH))
            if not leads_to or leads_to == parts:
                raise
            self._write("/".join(leads_to), data, os.O_TRUNC, metadata=checked, replace=True)
        return len(data)

    @_mounted(write=True)
    def append_text(self, path: str, text: str) -> None:
        """Append to a file the gateway owns for the session (full text of capped output)."""
        self._write(path, text.encode("utf-8", "replace"), os.O_APPEND)

    def _write(self, path: str, data: bytes, mode: int, *,
               metadata: dict[str, str] | None = None, replace: bool = False) -> None:
        """Write ``data`` to a regular file at ``path`` (``mode``: truncate or append), made
        with parent folders if missing and owned by the sandbox user, never through a link;
        with ``replace``, ``metadata`` (checked) replaces its metadata."""
        parts = split_relative(path)
        with self._parent_fd(parts, create=True) as dir_fd:
            try:
                # O_NONBLOCK: opening a FIFO the sandboxed code left here must fail, not hang.
                fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | mode | os.O_NOFOLLOW
                             | os.O_NONBLOCK, 0o644, dir_fd=dir_fd)
            except OSError as exc:
                raise path_error(exc, path) from exc
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise WorkspaceError(f"{path!r} is not a regular file")
                if os.geteuid() == 0:
                    os.fchown(fd, SANDBOX_UID, SANDBOX_GID)
                view = memoryview(data)
                while view:  # a write near a full disk may be partial; the next one says why
                    view = view[os.write(fd, view):]
                if replace:
                    replace_metadata(fd, metadata, path)
            except OSError as exc:
                raise path_error(exc, path) from exc
            finally:
                os.close(fd)

    @_mounted(write=False)
    def read_bytes(self, path: str, limit: int) -> bytes:
        """The file's bytes; through links on its path while they stay in the workspace."""
        parts = split_relative(path)
        try:
            return self._read(parts, path, limit)
        except PathOutsideWorkspace:  # a link on the way: followed if it leads inside
            leads_to = resolve(parts, self._lookup, (SANDBOX_PATH, OLD_SANDBOX_PATH))
            if not leads_to or leads_to == parts:
                raise
            return self._read(leads_to, path, limit)

    def _read(self, parts: list[str], path: str, limit: int) -> bytes:
        with self._parent_fd(parts, create=False) as dir_fd:
            try:
                fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
            except OSError as exc:
                raise path_error(exc, path) from exc
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    raise WorkspaceError(f"{path!r} is not a regular file")
                if info.st_size > limit:
                    raise FileTooLarge(path, info.st_size, limit)
                chunks = []
                while chunk := os.read(fd, 1 << 20):
                    chunks.append(chunk)
                return b"".join(chunks)
            finally:
                os.close(fd)

    @_mounted(write=False)
    def list_files(self) -> list[FileInfo]:
        """Every regular file, recursively, as paths relative to the workspace.

        Walked with an explicit stack, not recursion: the sandboxed code chooses the depth.
        Each folder is opened without following a link and read through its descriptor; one
        that is not on the workspace's own file system (a link swapped in mid-walk) is skipped.
        Names that are not UTF-8 are shown with backslash escapes (JSON cannot carry them).
        """
        found: list[FileInfo] = []
        device = os.stat(self.root).st_dev
        folders = [""]
        while folders:
            folder = folders.pop()
            try:
                fd = os.open(os.path.join(self.root, folder),
                             os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            except OSError:
                continue  # gone, or a path too long to open: skip it
            subfolders = []
            try:
                if os.fstat(fd).st_dev != device:
                    continue
                with os.scandir(fd) as scan:
                    entries = sorted(scan, key=lambda entry: entry.name)
                for entry in entries:
                    path = os.path.join(folder, entry.name)
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(info.st_mode):
                        subfolders.append(path)
                    elif stat.S_ISREG(info.st_mode):
                        found.append(FileInfo(
                            path=os.fsencode(path).decode("utf-8", "backslashreplace"),
                            size=info.st_size,
                            modified=datetime.fromtimestamp(info.st_mtime, UTC).isoformat(),
                        ))
            finally:
                os.close(fd)
            folders.extend(reversed(subfolders))
        return found

    # -- folders and entries (E2B's filesystem API asks for them) ------------------------------

    @staticmethod
    def _parts(path: str) -> list[str]:
        """Like :func:`split_relative`, but ``""`` and ``"."`` name the workspace itself."""
        return [] if path in ("", ".") else split_relative(path)

    @contextmanager
    def _dir_fd(self, parts: list[str]) -> Iterator[int]:
        """The folder at ``parts``, opened without following any link on the way."""
        with self._parent_fd([*parts, "."], create=False) as fd:
            yield fd

    @_mounted(write=False)
    def stat(self, path: str) -> Entry:
        """What is at ``path``, with its metadata; a link is followed while it stays in the
        workspace (see :mod:`kernel_pool._links`), else described as itself."""
        parts = self._parts(path)
        if not parts:
            with self._dir_fd([]) as fd:
                return entry_of("", os.fstat(fd), metadata=read_metadata(fd, "."))
        with self._parent_fd(parts, create=False) as dir_fd:
            try:
                info = os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
                target = (os.readlink(parts[-1], dir_fd=dir_fd)
                          if stat.S_ISLNK(info.st_mode) else None)
            except OSError as exc:
                raise path_error(exc, path) from exc
            if target is None:
                return entry_of("/".join(parts), info,
                                metadata=read_metadata(dir_fd, parts[-1]))
        return self._link_entry(parts, info, target)

    def _lookup(self, folder: list[str], name: str) -> tuple[os.stat_result, str | None]:
        with self._dir_fd(folder) as fd:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            return info, os.readlink(name, dir_fd=fd) if stat.S_ISLNK(info.st_mode) else None

    def _link_entry(self, parts: list[str], info: os.stat_result, target: str) -> Entry:
        """The link at ``parts``: what it leads to in the workspace, or the link itself."""
        path = "/".join(parts)
        leads_to = resolve(parts, self._lookup, (SANDBOX_PATH, OLD_SANDBOX_PATH))
        if leads_to is not None:
            try:
                with self._dir_fd(leads_to[:-1]) as fd:
                    name = leads_to[-1] if leads_to else "."
                    found = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if not stat.S_ISLNK(found.st_mode):  # not swapped for a link meanwhile
                        return entry_of(path, found, target, resolved="/".join(leads_to),
                                        metadata=read_metadata(fd, name))
            except (OSError, WorkspaceError):
                pass
        return entry_of(path, info, target)

    @_mounted(write=False)
    def list_dir(self, path: str, depth: int = 1) -> list[Entry]:
        """The entries under the folder ``path``, ``depth`` levels down, depth first and by
        name (``a``, ``a/a1``, ``b``), as :meth:`stat` describes them; a link to a folder is
        not walked into."""
        parts = self._parts(path)
        if self.stat(path).kind != "dir":
            raise WorkspaceError(f"{path!r} is not a folder")
        try:
            link = bool(parts) and self._lookup(parts[:-1], parts[-1])[1] is not None
        except OSError as exc:
            raise path_error(exc, path) from exc
        if link:  # a link to a folder: its entries are listed by their own paths
            leads_to = resolve(parts, self._lookup, (SANDBOX_PATH, OLD_SANDBOX_PATH))
            parts = parts if leads_to is None else leads_to
        found: list[Entry] = []
        # An explicit stack of the folders being read: the sandboxed code chooses the depth.
        stack = [(parts, 1, iter(self._scan(parts)))]
        while stack:
            folder, level, entries = stack[-1]
            name, item = next(entries, (None, None))
            if name is None or item is None:
                stack.pop()
                continue
            found.append(item)
            if item.kind == "dir" and item.resolved is None and level < depth:
                stack.append(([*folder, name], level + 1, iter(self._scan([*folder, name]))))
        return found

    def _scan(self, folder: list[str]) -> list[tuple[str, Entry]]:
        """The entries of one folder by name, each with its name as the file system has it;
        none if it is gone, swapped for a link or on another file system mid-walk."""
        found: list[tuple[str, Entry]] = []
        try:
            with self._dir_fd(folder) as fd:
                if os.fstat(fd).st_dev != os.stat(self.root).st_dev:
                    return []
                with os.scandir(fd) as scan:
                    items = sorted(scan, key=lambda entry: entry.name)
                for item in items:
                    try:
                        info = item.stat(follow_symlinks=False)
                        target = (os.readlink(item.name, dir_fd=fd)
                                  if stat.S_ISLNK(info.st_mode) else None)
                    except OSError:
                        continue
                    found.append((item.name, entry_of(
                        "/".join([*folder, item.name]), info,
                        metadata=read_metadata(fd, item.name)) if target is None
                        else self._link_entry([*folder, item.name], info, target)))
        except WorkspaceError:
            return []
        return found

    @_mounted(write=True)
    def make_dir(self, path: str) -> bool:
        """Create the folder and its parents; False when it already exists."""
        parts = self._parts(path)
        if not parts:
            return False
        with self._parent_fd(parts, create=True) as dir_fd:
            try:
                os.mkdir(parts[-1], 0o755, dir_fd=dir_fd)
            except FileExistsError:
                if not stat.S_ISDIR(os.stat(parts[-1], dir_fd=dir_fd,
                                            follow_symlinks=False).st_mode):
                    raise WorkspaceError(f"{path!r} exists and is not a folder") from None
                return False
            except OSError as exc:
                raise path_error(exc, path) from exc
            self._own(parts[-1], dir_fd)
        return True

    @_mounted(write=True)
    def remove(self, path: str) -> None:
        """Delete a file, a link (not what it points to) or a folder with everything in it."""
        parts = self._parts(path)
        if not parts:
            raise WorkspaceError("the workspace itself cannot be removed")
        with self._parent_fd(parts, create=False) as dir_fd:
            try:
                info = os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    # rmtree with dir_fd walks by descriptors and never follows a link out
                    shutil.rmtree(parts[-1], dir_fd=dir_fd)
                else:
                    os.unlink(parts[-1], dir_fd=dir_fd)
            except OSError as exc:
                raise path_error(exc, path) from exc

    @_mounted(write=True)
    def move(self, source: str, destination: str) -> Entry:
        """Rename ``source`` to ``destination`` (its parent folders are created)."""
        src, dst = self._parts(source), self._parts(destination)
        if not src or not dst:
            raise WorkspaceError("the workspace itself cannot be moved or replaced")
        with self._parent_fd(src, create=False) as src_fd, \
                self._parent_fd(dst, create=True) as dst_fd:
            try:
                os.rename(src[-1], dst[-1], src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            except OSError as exc:
                raise path_error(exc, f"{source} -> {destination}") from exc
        return self.stat(destination)
