"""A fork's copy of its parent's workspace: regular files, folders and links, read without
following a link or opening anything else (a FIFO, a device); files' and folders' metadata
(``user.e2b.*`` attributes) with them."""

from __future__ import annotations

import contextlib
import os
import stat

from kernel_pool._disk import SANDBOX_GID, SANDBOX_UID
from kernel_pool._metadata import copy_metadata
from kernel_pool._variables import TRANSFER_NAME
from kernel_pool._workspace import Workspace


def copy_workspace(source: Workspace, target: Workspace) -> None:
    """Copy regular files, folders and symlinks (as links) from one workspace into another.

    Blocking. The source is written by sandboxed code, possibly while this runs: every entry
    is opened relative to its parent's descriptor without following links, and anything but
    a regular file, a folder or a link (a FIFO, a device) is skipped, so the copy never reads
    outside the source nor hangs.
    """
    with source.access(), target.access(write=True):
        src = os.open(source.root, os.O_RDONLY | os.O_DIRECTORY)
        dst = os.open(target.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _copy_tree(src, dst, depth=0)
        finally:
            os.close(src)
            os.close(dst)

MAX_COPY_DEPTH = 64


def _copy_tree(src: int, dst: int, depth: int) -> None:
    if depth > MAX_COPY_DEPTH:
        return
    for entry in os.scandir(src):
        name = entry.name
        if name.startswith(TRANSFER_NAME) or (depth == 0 and name == "lost+found"):
            continue
        try:
            info = os.stat(name, dir_fd=src, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(info.st_mode):
            with contextlib.suppress(OSError):
                os.symlink(os.readlink(name, dir_fd=src), name, dir_fd=dst)
                _own(name, dst)
        elif stat.S_ISDIR(info.st_mode):
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, stat.S_IMODE(info.st_mode) | 0o700, dir_fd=dst)
                _own(name, dst)
                copy_metadata(src, name, dst)
            child_src = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=src)
            try:
                child_dst = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                                    dir_fd=dst)
                try:
                    _copy_tree(child_src, child_dst, depth + 1)
                finally:
                    os.close(child_dst)
            finally:
                os.close(child_src)
        elif stat.S_ISREG(info.st_mode):
            _copy_file(name, src, dst, stat.S_IMODE(info.st_mode))
            copy_metadata(src, name, dst)



def _copy_file(name: str, src: int, dst: int, mode: int) -> None:
    try:
        fin = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=src)
    except OSError:
        return
    try:
        if not stat.S_ISREG(os.fstat(fin).st_mode):
            return
        fout = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode,
                       dir_fd=dst)
        try:
            while chunk := os.read(fin, 1 << 20):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fout, view):]
            if os.geteuid() == 0:
                os.fchown(fout, SANDBOX_UID, SANDBOX_GID)
        finally:
            os.close(fout)
    finally:
        os.close(fin)



def _own(name: str, dir_fd: int) -> None:
    if os.geteuid() == 0:
        os.chown(name, SANDBOX_UID, SANDBOX_GID, dir_fd=dir_fd, follow_symlinks=False)
