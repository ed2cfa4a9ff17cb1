"""Giving a parked workspace image's blocks back to the host: free blocks trimmed through the
loop device (FITRIM), the reserved but never written ones punched out (FIEMAP)."""

from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import struct
from pathlib import Path

logger = logging.getLogger(__name__)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
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


def trim(root: Path) -> None:
    """Write back (an unmount does not where another namespace holds it:
    :func:`kernel_pool._disk._mount_live`) and discard the free blocks of the file system
    mounted at ``root``: its loop device punches them out of the image. A host that cannot (no
    discard) keeps them, which costs disk only."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _libc.syncfs(fd)
        fcntl.ioctl(fd, FITRIM, struct.pack("=QQQ", 0, 2**64 - 1, 0))
    except OSError as exc:
        logger.debug("cannot trim %s: %s", root, exc)
    finally:
        os.close(fd)



def punch_unwritten(image: Path) -> None:
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
