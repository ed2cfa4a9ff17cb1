"""``file:///path``: bundles in a folder, for one machine or a file system nodes share.

A write goes to a file of its own under ``.staging`` (the same file system, so the rename that
commits it is atomic), is flushed to disk, then renamed over the key's path; a paused session
so survives a crash of the host as it does in the state directory.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import BinaryIO

import anyio
import anyio.to_thread

from kernel_pool.bundles._errors import BundleNotFound, BundleStoreError
from kernel_pool.bundles._store import PART_SIZE, BundleStore, ObjectWriter, check_key

_STAGING = ".staging"


class _FileWriter:
    def __init__(self, file: BinaryIO) -> None:
        self._file = file

    async def write(self, chunk: bytes) -> None:
        await anyio.to_thread.run_sync(self._file.write, chunk)


class FileStore(BundleStore):
    """Objects as files under ``root``, each key a relative path."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    @asynccontextmanager
    async def writer(self, key: str) -> AsyncIterator[ObjectWriter]:
        target = self._path(key)
        staging = self.root / _STAGING / secrets.token_hex(16)
        try:
            file = await anyio.to_thread.run_sync(_create, staging, target.parent)
        except OSError as exc:
            raise BundleStoreError(self.url, f"cannot write {key}: {exc}") from exc
        try:
            yield _FileWriter(file)
            await anyio.to_thread.run_sync(_commit, file, staging, target)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_discard, file, staging)
            if isinstance(exc, OSError):
                raise BundleStoreError(self.url, f"cannot write {key}: {exc}") from exc
            raise

    async def reader(self, key: str) -> AsyncGenerator[bytes, None]:
        path = self._path(key)
        try:
            file = await anyio.open_file(path, "rb")
        except FileNotFoundError:
            raise BundleNotFound(key) from None
        except OSError as exc:
            raise BundleStoreError(self.url, f"cannot read {key}: {exc}") from exc
        async with file:
            while True:
                try:
                    chunk = await file.read(PART_SIZE)
                except OSError as exc:
                    raise BundleStoreError(self.url, f"cannot read {key}: {exc}") from exc
                if not chunk:
                    return
                yield chunk

    async def exists(self, key: str) -> bool:
        return await anyio.to_thread.run_sync(self._path(key).is_file)

    async def delete(self, key: str) -> None:
        await anyio.to_thread.run_sync(_delete, self.root, self._path(key))

    async def list(self, prefix: str) -> list[str]:
        folder = self._path(prefix) if prefix else self.root
        return await anyio.to_thread.run_sync(_list, self.root, folder)


def _create(staging: Path, folder: Path) -> BinaryIO:
    staging.parent.mkdir(parents=True, exist_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    return staging.open("xb")


def _commit(file: BinaryIO, staging: Path, target: Path) -> None:
    file.flush()
    os.fsync(file.fileno())
    file.close()
    os.replace(staging, target)
    # the rename itself must reach the disk for the object to outlive a crash
    folder = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def _discard(file: BinaryIO, staging: Path) -> None:
    file.close()
    staging.unlink(missing_ok=True)


def _delete(root: Path, path: Path) -> None:
    path.unlink(missing_ok=True)
    # empty folders of deleted bundles would pile up, one per session ever paused
    folder = path.parent
    while folder != root and folder.is_relative_to(root):
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


def _list(root: Path, folder: Path) -> list[str]:
    keys: list[str] = []
    staging = root / _STAGING
    for dirpath, dirnames, filenames in os.walk(folder):
        if Path(dirpath) == root:
            with contextlib.suppress(ValueError):
                dirnames.remove(staging.name)
        keys.extend(Path(dirpath, name).relative_to(root).as_posix() for name in filenames)
    return sorted(keys)
