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
import logging
import os
import shutil
import stat
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Concatenate, Literal, ParamSpec, TypeVar

from kernel_pool._disk import (
    _allocate,
    _mount,
    _punch_unwritten,
    _refill,
    _reserve,
    _trim,
    _unmount,
    detach,
)
from kernel_pool._entries import Entry as Entry
from kernel_pool._entries import FileInfo as FileInfo
from kernel_pool._entries import _entry, _path_error
from kernel_pool._entries import split_relative as split_relative
from kernel_pool.exceptions import FileTooLarge, WorkspaceError

logger = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")

SANDBOX_UID = 1000
SANDBOX_GID = 1000
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


class Workspace:
    """A workspace folder on the host. Blocking I/O: call from a worker thread."""

    def __init__(self, root: Path, image: Path | None = None, *, parked: bool = False) -> None:
        self.root = root
        self.image = image
        self._guard = threading.Condition(threading.Lock())
        self._users = 0
        """File operations under way (each holds the mount it uses)."""
        self._parked = parked and image is not None
        self._mount: Literal["ro", "rw"] | None = None if self._parked else "rw"
        """How the image is mounted now: "rw" (reserved), "ro" (parked, lent to readers)."""

    @classmethod
    def create(cls, root: Path, size_bytes: int) -> Workspace:
        """Make (or take back) the workspace at ``root`` with a cap of ``size_bytes``."""
        root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0:
            logger.warning("not root: workspace %s has no enforced size cap", root)
            os.chmod(root, 0o777)
            return cls(root)
        image = root.with_suffix(".ext4")
        if os.path.ismount(root):
            return cls(root, image)
        if not image.exists():
            _allocate(image, size_bytes)
            # nodiscard: mkfs would otherwise punch the reserved blocks out again.
            subprocess.run(
                ["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
                 "-E", f"root_owner={SANDBOX_UID}:{SANDBOX_GID},nodiscard", str(image)],
                check=True, capture_output=True,
            )
        else:
            _reserve(image)  # a parked one (a paused session's, after a reboot)
        _mount(image, root, read_only=False)
        lost = root / "lost+found"
        if lost.is_dir():
            lost.rmdir()
        return cls(root, image)

    @classmethod
    def take_back_parked(cls, root: Path, size_bytes: int) -> Workspace:
        """A paused session's workspace after a gateway restart: parked (given back now if a
        previous gateway left it mounted). Without root, the plain folder."""
        image = root.with_suffix(".ext4")
        if os.geteuid() != 0 or not image.exists():
            return cls.create(root, size_bytes)
        root.mkdir(parents=True, exist_ok=True)  # where it is mounted when used
        mounted = os.path.ismount(root)
        workspace = cls(root, image, parked=not mounted)
        if mounted:
            workspace.park()
        return workspace

    def destroy(self) -> None:
        """Unmount and delete everything; afterwards no byte of the workspace remains.

        Under the guard: a file operation's end parks the workspace (unmounts it) under it
        too, so the mount cannot go between the check and the unmount here. One that went
        anyway (someone else unmounted it) is not an error.
        """
        with self._guard:
            if os.path.ismount(self.root):
                detach(self.root)
            self._mount = None
        shutil.rmtree(self.root, ignore_errors=True)
        if self.image is not None:
            self.image.unlink(missing_ok=True)

    # -- parking (a paused session's workspace) -------------------------------------------------

    @property
    def parked(self) -> bool:
        return self._parked

    def park(self) -> None:
        """Give back every block the files do not use, and the mount, once no file operation
        uses it (now, or when the last one ends). Call only when no sandbox has it mounted:
        its container is gone. Without root (no image) there is nothing to give back."""
        if self.image is None:
            return
        with self._guard:
            self._parked = True
            if self._users == 0 and self._mount is not None:
                try:
                    self._give_back()
                except WorkspaceError as exc:  # kept whole, tried again after its next use
                    logger.warning("workspace %s stays mounted: %s", self.root, exc)

    def unpark(self) -> None:
        """Reserve the full size again and mount the workspace for a sandbox to use;
        :class:`StateDirFull` (the workspace stays parked, its files intact) when the host's
        disk cannot give the blocks back."""
        with self._guard:
            if not self._parked:
                return
            while self._mount == "ro":  # lent to readers: their read-only mount goes first
                self._guard.wait()
            if self._mount is None:
                self._mount_parked(write=True)
            self._parked = False

    @property
    def _image(self) -> Path:
        assert self.image is not None
        return self.image

    def used_bytes(self) -> int:
        """What the workspace's files and metadata hold on disk (an estimate while parked);
        without a file system of its own (not root), more than anything copied on resume."""
        if self.image is None:
            return 2**62
        with self._guard:
            if self._mount is None:
                return os.stat(self.image).st_blocks * 512
            info = os.statvfs(self.root)
            return (info.f_blocks - info.f_bfree) * info.f_frsize

    @contextmanager
    def access(self, write: bool = False) -> Iterator[None]:
        """The workspace mounted for one file operation: a parked workspace is mounted for
        its duration (read-only for readers, who share it; reserved first for a writer), and
        parked again when the last operation ends."""
        with self._guard:
            while write and self._mount == "ro":
                self._guard.wait()
            if self._mount is None:
                self._mount_parked(write)
            self._users += 1
        try:
            yield
        finally:
            with self._guard:
                self._users -= 1
                if self._users == 0 and self._parked and self._mount is not None:
                    try:
                        self._give_back()
                    except WorkspaceError as exc:
                        logger.warning("workspace %s stays mounted: %s", self.root, exc)
                    self._guard.notify_all()

    def _mount_parked(self, write: bool) -> None:
        """Mount the parked image (guard held): writable after reserving it, else read-only.
        On failure it stays parked as it was."""
        if write:
            _reserve(self._image)
        try:
            _mount(self._image, self.root, read_only=not write)
        except WorkspaceError:
            if write:
                _punch_unwritten(self._image)  # the reserve goes back with the failed mount
            raise
        self._mount = "rw" if write else "ro"

    def _give_back(self) -> None:
        """Unmount (guard held, no user); if it was writable, first punch its free blocks out
        of the image (discards, which the loop device turns into holes), then the reserved
        blocks nothing ever wrote (metadata reserved but still zeros)."""
        writable = self._mount == "rw"
        if writable:
            _trim(self.root)
        try:
            _unmount(self.root, read_only=not writable)
        except WorkspaceError:
            if writable:  # it stays mounted, writable: what the trim gave back is taken again
                _refill(self._image)
            raise
        self._mount = None
        if writable:
            _punch_unwritten(self._image)

    # -- files -------------------------------------------------------------------------------

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
                    raise _path_error(exc, "/".join(parts)) from exc
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
    def write_bytes(self, path: str, data: bytes) -> int:
        self._write(path, data, os.O_TRUNC)
        return len(data)

    @_mounted(write=True)
    def append_text(self, path: str, text: str) -> None:
        """Append to a file the gateway owns for the session (full text of capped output)."""
        self._write(path, text.encode("utf-8", "replace"), os.O_APPEND)

    def _write(self, path: str, data: bytes, mode: int) -> None:
        """Write ``data`` to a regular file at ``path`` (``mode``: truncate or append), made
        with parent folders if missing and owned by the sandbox user, never through a link."""
        parts = split_relative(path)
        with self._parent_fd(parts, create=True) as dir_fd:
            try:
                # O_NONBLOCK: opening a FIFO the sandboxed code left here must fail, not hang.
                fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | mode | os.O_NOFOLLOW
                             | os.O_NONBLOCK, 0o644, dir_fd=dir_fd)
            except OSError as exc:
                raise _path_error(exc, path) from exc
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise WorkspaceError(f"{path!r} is not a regular file")
                if os.geteuid() == 0:
                    os.fchown(fd, SANDBOX_UID, SANDBOX_GID)
                view = memoryview(data)
                while view:  # a write near a full disk may be partial; the next one says why
                    view = view[os.write(fd, view):]
            except OSError as exc:
                raise _path_error(exc, path) from exc
            finally:
                os.close(fd)

    @_mounted(write=False)
    def read_bytes(self, path: str, limit: int) -> bytes:
        parts = split_relative(path)
        with self._parent_fd(parts, create=False) as dir_fd:
            try:
                fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
            except OSError as exc:
                raise _path_error(exc, path) from exc
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
        """What is at ``path`` (a link is described, not followed)."""
        parts = self._parts(path)
        if not parts:
            return _entry("", os.stat(self.root))
        with self._parent_fd(parts, create=False) as dir_fd:
            try:
                info = os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
                target = (os.readlink(parts[-1], dir_fd=dir_fd)
                          if stat.S_ISLNK(info.st_mode) else None)
            except OSError as exc:
                raise _path_error(exc, path) from exc
        return _entry("/".join(parts), info, target)

    @_mounted(write=False)
    def list_dir(self, path: str, depth: int = 1) -> list[Entry]:
        """The entries under the folder ``path``, ``depth`` levels down (links not followed)."""
        parts = self._parts(path)
        if self.stat(path).kind != "dir":
            raise WorkspaceError(f"{path!r} is not a folder")
        device = os.stat(self.root).st_dev
        found: list[Entry] = []
        folders = [(parts, 1)]
        while folders:  # an explicit stack: the sandboxed code chooses the depth
            folder, level = folders.pop()
            try:
                with self._dir_fd(folder) as fd:
                    if os.fstat(fd).st_dev != device:
                        continue
                    with os.scandir(fd) as scan:
                        entries = sorted(scan, key=lambda entry: entry.name)
                    for item in entries:
                        try:
                            info = item.stat(follow_symlinks=False)
                            target = (os.readlink(item.name, dir_fd=fd)
                                      if stat.S_ISLNK(info.st_mode) else None)
                        except OSError:
                            continue
                        found.append(_entry("/".join([*folder, item.name]), info, target))
                        if stat.S_ISDIR(info.st_mode) and level < depth:
                            folders.append(([*folder, item.name], level + 1))
            except WorkspaceError:
                continue  # removed or swapped for a link mid-walk: skip it
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
                raise _path_error(exc, path) from exc
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
                raise _path_error(exc, path) from exc

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
                raise _path_error(exc, f"{source} -> {destination}") from exc
        return self.stat(destination)
