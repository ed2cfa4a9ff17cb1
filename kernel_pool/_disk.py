"""A workspace's disk: its image file, loop mounts, and the blocks it holds on the host.

The image's blocks are reserved whole (``fallocate``) while a sandbox may write, and given back
when it is parked: free blocks trimmed through the loop device, the never-written ones punched
out (FIEMAP). Unmounts are immediate where a writer could be left, lazy (:func:`detach`) where
nothing can write. :class:`WorkspaceDisk` decides when, for the file API built on it
(:class:`~kernel_pool._workspace.Workspace`).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, Self

from kernel_pool._disk_blocks import punch_unwritten, trim
from kernel_pool.exceptions import StateDirFull, WorkspaceError

logger = logging.getLogger(__name__)

SANDBOX_UID = 1000
SANDBOX_GID = 1000
"""The sandbox's user, who owns a workspace's files."""


def _allocate(image: Path, size_bytes: int) -> None:
    """Reserve every block of a workspace's image now, not as the sandbox writes.

    A sparse image would let the sandboxes together promise more than the host's disk holds:
    once it is full, a sandbox's writes are lost in the loop device (its own and the others').
    Reserved, a full host disk shows here, at creation, as a clear error.
    """
    fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, size_bytes)
    except OSError as exc:
        image.unlink(missing_ok=True)
        free = shutil.disk_usage(image.parent).free
        raise WorkspaceError(
            f"no room for a workspace of {size_bytes} bytes under {image.parent} ({free} bytes "
            f"free: {exc.strerror}); free disk space there or lower workspace_size") from exc
    finally:
        os.close(fd)


def _reserve(image: Path) -> None:
    """Reserve every block of a parked image again (its files are kept: reserving writes
    nothing); :class:`StateDirFull` when the host's disk cannot give them."""
    fd = os.open(image, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        missing = max(info.st_size - info.st_blocks * 512, 0)
        free = shutil.disk_usage(image.parent).free
        why = (f"a paused session's workspace needs {missing} more bytes under {image.parent} "
               "to run or take a file; delete sessions or free disk space")
        if missing > free:
            raise StateDirFull(free, why)
        try:
            os.posix_fallocate(fd, 0, info.st_size)
        except OSError as exc:
            punch_unwritten(image)  # what the failed call took goes back
            raise StateDirFull(shutil.disk_usage(image.parent).free,
                               f"{why} ({exc.strerror})") from exc
    finally:
        os.close(fd)


def _refill(image: Path) -> None:
    """Reserve a mounted image's blocks again after a trim (nothing is punched on failure:
    a mounted image's unwritten blocks may be written any moment)."""
    fd = os.open(image, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
    except OSError as exc:
        logger.error("workspace image %s could not be reserved again (%s): its sandbox's "
                     "writes may fail when the host's disk is full", image, exc.strerror)
    finally:
        os.close(fd)


def _mount(image: Path, root: Path, read_only: bool) -> None:
    options = "loop,nosuid,nodev,noinit_itable" + (",ro,noexec" if read_only else "")
    # -w: a writable mount or none. Without it, mount reuses the read-only loop device a
    # reader's mount left (let go only after its unmount returns), warns "write-protected,
    # mounted read-only" and succeeds: the sandbox then started on a read-only workspace.
    mode = "-r" if read_only else "-w"
    deadline = time.monotonic() + MOUNT_SETTLE_S
    while True:
        try:
            _run(["mount", mode, "-o", options, str(image), str(root)])
            return
        except WorkspaceError as exc:
            # The loop device of the image's last mount is let go after its unmount returns
            # (autoclear): until then mount takes the image for one still mounted, or (a
            # reader's) for a write-protected one.
            settling = any(words in str(exc) for words in (
                "already mounted or mount point busy", "Read-only file system"))
            if not settling or time.monotonic() > deadline:
                raise
            if read_only and _mount_live(image, root):
                return
            time.sleep(0.05)


def _mount_live(image: Path, root: Path) -> bool:
    """Mount read-only an image live in another mount namespace (``ip netns exec``, made while
    it was mounted), whose writable superblock refuses a read-only mount (EBUSY): through its
    own loop device (that superblock, never a second one), read-only for this mount; or False."""
    found = subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True)
    device = found.stdout.partition(":")[0].strip()
    mount = ["mount", "-o", "nosuid,nodev,noexec", device, str(root)]
    if not device.startswith("/dev/loop") or subprocess.run(mount, capture_output=True).returncode:
        return False
    try:
        _run(["mount", "-o", "remount,bind,ro,nosuid,nodev,noexec", str(root)])
    except WorkspaceError:
        detach(root)
        raise
    return True


MOUNT_SETTLE_S = 2.0
"""How long a mount waits for the image's previous loop device to be let go."""
_libc = ctypes.CDLL(None, use_errno=True)
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
UNMOUNT_WAITS_S = (0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.8)
"""Pauses between tries of an unmount found busy: a process the gateway spawns (``mount``,
``mkfs``) holds copies of its open files until it starts its program, files of the workspace
among them if a file operation had one open then."""
MNT_DETACH = 2


def _unmount(root: Path, read_only: bool) -> None:
    """Unmount now, not lazily, so that no writer is left on a parked image (it would stay
    mounted: EBUSY); a read-only mount found busy after every try is detached lazily, which
    is safe, since nothing can write through it. Its loop device detaches with it."""
    for wait in (*UNMOUNT_WAITS_S, None):
        if _libc.umount2(os.fsencode(root), 0) == 0:
            return
        code = ctypes.get_errno()
        if code != errno.EBUSY or wait is None:
            break
        time.sleep(wait)
    if read_only and code == errno.EBUSY and _libc.umount2(os.fsencode(root), MNT_DETACH) == 0:
        return
    raise WorkspaceError(f"cannot unmount {root}: {os.strerror(code)}")


def detach(root: Path) -> None:
    """Unmount lazily (a process with a file open there keeps it until it closes it); a mount
    found gone meanwhile is done, not an error."""
    if _libc.umount2(os.fsencode(root), MNT_DETACH) != 0:
        code = ctypes.get_errno()
        if os.path.ismount(root):
            raise WorkspaceError(f"cannot unmount {root}: {os.strerror(code)}")


def _run(cmd: list[str]) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise WorkspaceError(f"{' '.join(cmd)} failed: {result.stderr.strip()}")


class WorkspaceDisk:
    """A workspace's disk as the host holds it: made, taken back, destroyed; parked (its
    unused blocks and mount given back) and mounted again for each use (:meth:`access`).
    Blocking I/O: call from a worker thread."""

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
    def create(cls, root: Path, size_bytes: int) -> Self:
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
    def take_back_parked(cls, root: Path, size_bytes: int) -> Self:
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
                punch_unwritten(self._image)  # the reserve goes back with the failed mount
            raise
        self._mount = "rw" if write else "ro"

    def _give_back(self) -> None:
        """Unmount (guard held, no user); if it was writable, first punch its free blocks out
        of the image (discards, which the loop device turns into holes), then the reserved
        blocks nothing ever wrote (metadata reserved but still zeros)."""
        writable = self._mount == "rw"
        if writable:
            trim(self.root)
        try:
            _unmount(self.root, read_only=not writable)
        except WorkspaceError:
            if writable:  # it stays mounted, writable: what the trim gave back is taken again
                _refill(self._image)
            raise
        self._mount = None
        if writable:
            punch_unwritten(self._image)
