"""A workspace's disk: its image file, loop mounts, and the blocks it holds on the host.

The image's blocks are reserved whole (``fallocate``) while a sandbox may write, and given back
when it is parked: free blocks trimmed through the loop device, the never-written ones punched
out (FIEMAP). Unmounts are immediate where a writer could be left, lazy (:func:`detach`) where
nothing can write. :class:`~kernel_pool._workspace.Workspace` decides when; this module does it.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import shutil
import struct
import subprocess
import time
from pathlib import Path

from kernel_pool.exceptions import StateDirFull, WorkspaceError

logger = logging.getLogger(__name__)


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
            _punch_unwritten(image)  # what the failed call took goes back
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
    deadline = time.monotonic() + MOUNT_SETTLE_S
    while True:
        try:
            _run(["mount", "-o", options, str(image), str(root)])
            return
        except WorkspaceError as exc:
            # The loop device of the image's last mount is let go after its unmount returns
            # (autoclear): until then mount takes the image for one still mounted.
            if "already mounted or mount point busy" not in str(exc) or \
                    time.monotonic() > deadline:
                raise
            time.sleep(0.05)


MOUNT_SETTLE_S = 2.0
"""How long a mount waits for the image's previous loop device to be let go."""
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FITRIM = 0xC0185879
"""``_IOWR('X', 121, struct fstrim_range)``: discard a mounted file system's free blocks."""
FS_IOC_FIEMAP = 0xC020660B
FIEMAP_FLAG_SYNC = 0x1
FIEMAP_EXTENT_LAST = 0x1
FIEMAP_EXTENT_UNWRITTEN = 0x800
FIEMAP_BATCH = 128
_FIEMAP_HEAD = struct.Struct("=QQLLLL")
_FIEMAP_EXTENT = struct.Struct("=QQQQQL12x")


def _trim(root: Path) -> None:
    """Discard the free blocks of the file system mounted at ``root``: its loop device punches
    them out of the image. A host that cannot (no discard) keeps them, which costs disk only."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, FITRIM, struct.pack("=QQQ", 0, 2**64 - 1, 0))
    except OSError as exc:
        logger.debug("cannot trim %s: %s", root, exc)
    finally:
        os.close(fd)


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


def _punch_unwritten(image: Path) -> None:
    """Punch out the image's blocks that are reserved but were never written (they read as
    zeros, so nothing changes): ext4's inode tables, say, and what a failed reserve took.
    Only on an image no writable mount uses (FIEMAP's sync flushes what the loop wrote)."""
    fd = os.open(image, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        start, holes = 0, []
        while True:
            request = bytearray(_FIEMAP_HEAD.pack(start, 2**64 - 1 - start, FIEMAP_FLAG_SYNC,
                                                  0, FIEMAP_BATCH, 0)
                                + bytes(_FIEMAP_EXTENT.size * FIEMAP_BATCH))
            fcntl.ioctl(fd, FS_IOC_FIEMAP, request)
            mapped = _FIEMAP_HEAD.unpack_from(request)[3]
            last = not mapped
            for index in range(mapped):
                offset, _, length, _, _, flags = _FIEMAP_EXTENT.unpack_from(
                    request, _FIEMAP_HEAD.size + index * _FIEMAP_EXTENT.size)
                if flags & FIEMAP_EXTENT_UNWRITTEN:
                    holes.append((offset, length))
                start = offset + length
                last = last or bool(flags & FIEMAP_EXTENT_LAST)
            if last:
                break
        for offset, length in holes:
            if _libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset,
                               length) != 0:
                code = ctypes.get_errno()
                logger.debug("cannot punch %s: %s", image, os.strerror(code))
                return
    except OSError as exc:  # no FIEMAP (another host file system): the blocks stay reserved
        logger.debug("cannot map %s: %s", image, exc)
    finally:
        os.close(fd)


def _run(cmd: list[str]) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise WorkspaceError(f"{' '.join(cmd)} failed: {result.stderr.strip()}")
