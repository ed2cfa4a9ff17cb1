"""A paused session as a bundle: its variables snapshot, as stored, and its workspace's files,
as one tar stream; written after its pause, read into a new sandbox on another node.

Neither part is held whole in memory nor staged on disk: the workspace is walked (and the tar
unpacked) in a worker thread, which hands chunks to the event loop through a small queue. The
workspace is written by sandboxed code, so it is walked as :func:`copy_workspace` walks it
(relative to each folder's descriptor, links never followed, anything but files, folders and
links skipped); the tar is unpacked the same way, each name checked, into a workspace no
sandbox runs in yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import tarfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread
import anyio.to_thread
from anyio.streams.memory import MemoryObjectReceiveStream

from kernel_pool._disk import SANDBOX_GID, SANDBOX_UID
from kernel_pool._metadata import pax_metadata, restore_pax_metadata
from kernel_pool._snapshot import SnapshotStore
from kernel_pool._streams import SUFFIXES
from kernel_pool._variables import TRANSFER_NAME
from kernel_pool._workspace import Workspace
from kernel_pool.bundles._errors import BundleCorrupt, BundleNotFound
from kernel_pool.bundles._manifest import BundleInfo
from kernel_pool.bundles._store import PART_SIZE
from kernel_pool.exceptions import SnapshotError
from kernel_pool.state import KeptContext, PauseInfo

if TYPE_CHECKING:
    from kernel_pool.bundles._bundle import Bundle, Bundles

SNAPSHOT = "snapshot"
"""The snapshot's part is ``snapshot<suffix>``: stored as the pausing node stored it."""
WORKSPACE = "workspace.tar"
MAX_DEPTH = 64
CHUNK = 1 << 20

Emit = Callable[[bytes], None]


async def write_session(bundles: Bundles, tenant: str, session_id: str, info: BundleInfo,
                        snapshots: SnapshotStore | None, workspace: Workspace) -> int:
    """Write the bundle of a paused session: its snapshot in ``snapshots`` (None: its files
    alone, a saved snapshot that keeps no variables) and the files of ``workspace``,
    committed (replacing its previous bundle) once both are whole; the bytes written."""
    reader, suffix = (await anyio.to_thread.run_sync(snapshots.open_read, session_id)
                      if snapshots is not None else (None, ""))
    try:
        async with bundles.write(tenant, session_id, info) as writer:
            if reader is not None:
                async with writer.part(SNAPSHOT + suffix) as part:
                    while chunk := await anyio.to_thread.run_sync(reader.read, PART_SIZE):
                        await part.write(chunk)
            async with writer.part(WORKSPACE) as part:
                await _produced(lambda emit: _tar_workspace(workspace, emit), part.write)
    finally:
        if reader is not None:
            reader.close()
    return sum(part.size for part in writer.parts.values())


def holds_variables(bundle: Bundle) -> bool:
    """Whether the bundle holds a variables snapshot (a saved snapshot may hold files
    alone)."""
    return any(name.startswith(SNAPSHOT) for name in bundle.manifest.parts)


async def read_session(bundle: Bundle, session_id: str, snapshots: SnapshotStore,
                       workspace: Workspace) -> PauseInfo:
    """Restore a bundle: its files into ``workspace`` (a new sandbox's, nothing running in
    it) and its snapshot into ``snapshots`` as ``session_id``'s; what the snapshot keeps. On
    an error (:class:`BundleCorrupt` among them) the caller removes the workspace; no snapshot
    is left."""
    manifest = bundle.manifest
    names = [n for n in manifest.parts if n.startswith(SNAPSHOT)]
    if len(names) != 1 or WORKSPACE not in manifest.parts:
        raise BundleNotFound(f"{manifest.tenant}/{session_id}: a snapshot and a workspace")
    suffix = names[0].removeprefix(SNAPSHOT)
    if suffix not in SUFFIXES:  # known before a byte of it is moved
        raise SnapshotError(f"a snapshot stored as {suffix!r} cannot be read here")
    writer = await anyio.to_thread.run_sync(snapshots.open_write, session_id)
    try:
        async with contextlib.aclosing(bundle.read(names[0])) as chunks:
            async for chunk in chunks:
                await anyio.to_thread.run_sync(writer.write, chunk)
    except BaseException:
        writer.abort()
        raise
    info = PauseInfo(paused_with="variables", kept=manifest.kept, not_kept=manifest.not_kept,
                     reseed=manifest.reseed, contexts=[
                         KeptContext(id=context_id, language=language)
                         for context_id, language in manifest.contexts.items()])
    kept: PauseInfo = await anyio.to_thread.run_sync(snapshots.commit, session_id, writer,
                                                     info, suffix)
    try:
        await read_files(bundle, workspace)
    except BaseException:
        await anyio.to_thread.run_sync(snapshots.delete, session_id)
        raise
    return kept


async def read_files(bundle: Bundle, workspace: Workspace) -> None:
    """Unpack the bundle's files into ``workspace`` (a new session's, nothing else writing
    in it yet). On an error the caller removes the workspace or its session."""
    if WORKSPACE not in bundle.manifest.parts:
        raise BundleNotFound(f"{bundle.manifest.tenant}/{bundle.manifest.session_id}: "
                             "a workspace")
    try:
        async with contextlib.aclosing(bundle.read(WORKSPACE)) as chunks:
            await _consumed(chunks, lambda source: _untar_workspace(source, workspace))
    except tarfile.TarError as exc:
        raise BundleCorrupt(WORKSPACE, f"its files do not read as a tar stream: {exc}") from None
    except OSError as exc:  # the host's words, not its paths: the tenant's error message
        raise SnapshotError("the bundle's files could not be written into the new workspace: "
                            f"{exc.strerror or type(exc).__name__}") from None


# -- between a worker thread and the event loop -----------------------------------------------

async def _produced(produce: Callable[[Emit], None],
                    consume: Callable[[bytes], Awaitable[None]]) -> None:
    """Run ``produce`` in a worker thread, awaiting ``consume`` on each chunk it emits."""
    send, receive = anyio.create_memory_object_stream[bytes](2)

    async def producing() -> None:
        with send:
            await anyio.to_thread.run_sync(
                produce, lambda chunk: anyio.from_thread.run(send.send, chunk))

    task = asyncio.ensure_future(producing())
    try:
        with receive:
            async for chunk in receive:
                await consume(chunk)
    except BaseException:
        # The receiver closed, the producer's next chunk fails and its thread ends.
        await asyncio.wait([task])
        if not task.cancelled():
            task.exception()
        raise
    await task


class _Received:
    """A file-like reader, in a worker thread, of chunks the event loop sends."""

    def __init__(self, receive: MemoryObjectReceiveStream[bytes]) -> None:
        self._receive = receive
        self._buffer = bytearray()
        self._ended = False

    def _fill(self) -> None:
        try:
            self._buffer += anyio.from_thread.run(self._receive.receive)
        except anyio.EndOfStream:
            self._ended = True

    def read(self, size: int = -1) -> bytes:
        while not self._ended and (size < 0 or len(self._buffer) < size):
            self._fill()
        count = len(self._buffer) if size < 0 else min(size, len(self._buffer))
        data = bytes(self._buffer[:count])
        del self._buffer[:count]
        return data

    def drain(self) -> None:
        """Read to the end (the sender's last chunk is the one its checks end with)."""
        while not self._ended:
            self._buffer.clear()
            self._fill()


async def _consumed(chunks: AsyncIterator[bytes], consume: Callable[[Any], None]) -> None:
    """Feed ``chunks`` to ``consume`` (which reads a file-like object) in a worker thread;
    every chunk is read, so a check that ends the stream (a part's hash) always runs."""
    send, receive = anyio.create_memory_object_stream[bytes](2)
    source = _Received(receive)

    def run() -> None:
        try:
            consume(source)
            source.drain()
        finally:
            anyio.from_thread.run_sync(receive.close)

    task = asyncio.ensure_future(anyio.to_thread.run_sync(run))
    try:
        with send:
            async for chunk in chunks:
                await send.send(chunk)
    except anyio.BrokenResourceError:
        pass  # the consumer stopped on an error: awaited below, it says which
    except BaseException:
        await asyncio.wait([task])
        if not task.cancelled():
            task.exception()
        raise
    await task


# -- the workspace as a tar stream --------------------------------------------------------------

class _Sink:
    """What tarfile writes to: chunks of about :data:`PART_SIZE`, emitted as they fill."""

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._buffer = bytearray()

    def write(self, data: bytes) -> int:
        self._buffer += data
        if len(self._buffer) >= PART_SIZE:
            self.flush()
        return len(data)

    def flush(self) -> None:
        if self._buffer:
            self._emit(bytes(self._buffer))
            self._buffer.clear()


def _tar_workspace(workspace: Workspace, emit: Emit) -> None:
    sink = _Sink(emit)
    with workspace.access(), tarfile.open(fileobj=sink, mode="w|",  # type: ignore[call-overload]
                                          format=tarfile.PAX_FORMAT) as tar:
        root = os.open(workspace.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _tar_tree(tar, root, "", 0)
        finally:
            os.close(root)
    sink.flush()


def _tar_tree(tar: tarfile.TarFile, folder: int, prefix: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        return
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        name = entry.name
        if name.startswith(TRANSFER_NAME) or (depth == 0 and name == "lost+found"):
            continue
        try:
            info = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            continue
        member = tarfile.TarInfo(prefix + name)
        member.mode, member.mtime = stat.S_IMODE(info.st_mode), int(info.st_mtime)
        member.uid, member.gid = SANDBOX_UID, SANDBOX_GID
        if stat.S_ISLNK(info.st_mode):
            with contextlib.suppress(OSError):
                member.type, member.linkname = tarfile.SYMTYPE, os.readlink(name, dir_fd=folder)
                tar.addfile(member)
        elif stat.S_ISDIR(info.st_mode):
            try:
                child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                                dir_fd=folder)
            except OSError:
                continue
            try:
                member.type = tarfile.DIRTYPE
                member.pax_headers = pax_metadata(folder, name)
                tar.addfile(member)
                _tar_tree(tar, child, f"{member.name}/", depth + 1)
            finally:
                os.close(child)
        elif stat.S_ISREG(info.st_mode):
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as file:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    continue
                member.size = os.fstat(fd).st_size  # nothing of a paused session writes it
                member.pax_headers = pax_metadata(folder, name)
                tar.addfile(member, file)


def _untar_workspace(source: _Received, workspace: Workspace) -> None:
    with workspace.access(write=True), tarfile.open(  # type: ignore[call-overload]
            fileobj=source, mode="r|") as tar:
        root = os.open(workspace.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for member in tar:
                _unpack(tar, member, root)
        finally:
            os.close(root)


def _unpack(tar: tarfile.TarFile, member: tarfile.TarInfo, root: int) -> None:
    parts = PurePosixPath(member.name).parts
    if (not parts or member.name.startswith("/") or any(p in ("", ".", "..") for p in parts)
            or len(parts) > MAX_DEPTH + 1):
        raise BundleCorrupt(member.name, "a workspace entry names a path outside it")
    folder = root
    opened: list[int] = []
    try:
        for part in parts[:-1]:  # made by their own entries, earlier in the stream
            folder = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=folder)
            opened.append(folder)
        name, mode = parts[-1], member.mode & 0o777
        if member.isdir():
            os.mkdir(name, mode | 0o700, dir_fd=folder)
        elif member.issym():
            os.symlink(member.linkname, name, dir_fd=folder)
        elif member.isfile():
            data = tar.extractfile(member)
            assert data is not None  # a regular file's entry has its bytes
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode,
                         dir_fd=folder)
            try:
                while chunk := data.read(CHUNK):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view):]
                os.utime(fd, (member.mtime, member.mtime))
            finally:
                os.close(fd)
        else:
            return  # the writer puts nothing else in; skipped rather than trusted
        if member.isfile() or member.isdir():
            restore_pax_metadata(folder, name, member.pax_headers)
        if os.geteuid() == 0:
            os.chown(name, SANDBOX_UID, SANDBOX_GID, dir_fd=folder, follow_symlinks=False)
    finally:
        for fd in reversed(opened):
            os.close(fd)
