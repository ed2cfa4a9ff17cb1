"""Variables snapshots: what a paused session keeps of its kernel, and how forks are seeded.

A snapshot is the user namespace pickled with dill by the kernel itself
(``replgate_kernel.snapshot`` in the sandbox image), streamed as it is written through a named
pipe in the sandbox's socket folder (a hidden file in its workspace where a pipe cannot cross,
under gVisor), compressed on the way (:mod:`kernel_pool._streams`), and kept in
``<state dir>/snapshots``, a folder only the gateway's user can read (mode 0700, files 0600)
and that no sandbox mounts. Neither side holds the whole of it in memory: the kernel writes
its arrays' buffers straight from their own memory, and the gateway moves a megabyte at a
time. The gateway never unpickles a snapshot: only a kernel of the same session (or of its
fork) loads it.

This keeps variables, not processes: threads, open sockets and generators are listed in
``not_kept`` and the running state of a process (``/tmp``, a background thread) is not kept.
The session says so (``paused_with: "variables"``).

A memory pause (``REPLGATE_PAUSE_WITH=memory``) keeps, beside the variables snapshot, a
checkpoint of the whole sandbox (every process, thread, open file, ``/tmp``) made by the
backend: ``<key>.memory.*`` in the same folder, under the same budget, deleted with it.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import errno
import fcntl
import json
import os
import secrets
import select
import stat
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from kernel_pool._streams import (
    SUFFIXES,
    ChunkReader,
    FileChunkReader,
    FileChunkWriter,
    Progress,
    Pump,
    copy,
)
from kernel_pool._workspace import SANDBOX_GID, SANDBOX_UID, Workspace
from kernel_pool.exceptions import SnapshotBudgetExceeded, SnapshotError

# (re-exported: kernel_pool.bundles and tests import them from here)
from kernel_pool.state import KeptContext as KeptContext
from kernel_pool.state import PauseInfo as PauseInfo

if TYPE_CHECKING:
    from kernel_pool._kernel import Kernel

MEMORY_INFIX = ".memory"
"""A memory image is ``<key>.memory.<the backend's suffix>``."""
TRANSFER_NAME = ".replgate-snapshot"
"""The pipe (or hidden workspace file) a snapshot passes through (a random suffix is added)."""
SNAPSHOT_TIMEOUT_S = 600.0
"""A snapshot streams the session's whole memory: minutes for many gigabytes, at worst."""
PIPE_BYTES = 1 << 20
"""A snapshot's pipe holds this much (the most an unprivileged process may ask for)."""
PIPE_WAIT_S = 0.05
PIPE_LINGER_S = 10.0
"""How long the end of a snapshot's stream may lag behind the kernel's answer."""
PUMP_VERDICT_S = 2.0
"""How long a failed snapshot or load waits for the pump's own verdict before stopping it."""
STOPPED_COMMAND = "command "
"""How a ``not_kept`` entry of a shell command a pause stopped begins (no pause keeps one)."""
STOPPED_CONTEXT = "context "
"""How a ``not_kept`` entry of a code context a pause ended begins (a variables pause keeps
none but the session's Python kernel; a memory pause keeps those it can, :class:`KeptContext`)."""


def context_entry(context_id: str) -> str:
    """A code context's name in ``not_kept``."""
    return f"{STOPPED_CONTEXT}{context_id!r}"


class SnapshotStore:
    """Compressed snapshots in one private folder, with a size budget."""

    def __init__(self, root: Path, budget_bytes: int) -> None:
        self.root = root
        self.budget_bytes = budget_bytes
        self._budget_lock = threading.Lock()
        self._used_at_most: int | None = None
        """What the snapshots take, or more: a scan's figure plus every save since (deletions
        are not taken off). The folder is scanned again only when a save would not fit in
        it, so the budget's verdict is exact while a save costs no scan of thousands."""
        self._held: dict[str, int] = {}
        """The memory dumps not packed yet, by key: their bytes, outside this folder (the
        backend's), counted against the budget until they are packed or deleted."""

    def _path(self, key: str, suffix: str) -> Path:
        if not key or "/" in key or key.startswith("."):
            raise SnapshotError(f"bad snapshot key {key!r}")
        return self.root / f"{key}{suffix}"

    def _ensure_root(self) -> None:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)

    def used_bytes(self) -> int:
        """What every snapshot takes on disk now, memory dumps not packed yet included
        (blocking)."""
        total = sum(self._held.values())
        if not self.root.is_dir():
            return total
        with os.scandir(self.root) as entries:
            for entry in entries:
                # Saves and deletions run beside this one (a fork writes its copies' snapshots
                # at once): a file may go (``.part`` renamed) between the listing and its stat.
                with contextlib.suppress(FileNotFoundError):
                    if entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
        return total

    def _reserve(self, size: int) -> None:
        """Count ``size`` more bytes being written against the budget, or
        :class:`SnapshotBudgetExceeded`."""
        with self._budget_lock:
            if self._used_at_most is None or self._used_at_most + size > self.budget_bytes:
                self._used_at_most = self.used_bytes()  # partial files as they are now
            if self._used_at_most + size > self.budget_bytes:
                raise SnapshotBudgetExceeded(
                    f"the snapshot does not fit in the budget of {self.budget_bytes} bytes "
                    "(REPLGATE_SNAPSHOT_BUDGET); delete sessions or raise it")
            self._used_at_most += size

    def open_write(self, key: str) -> FileChunkWriter:
        """A writer of the key's variables snapshot, counted against the budget as it goes;
        :meth:`commit` it with the info and how it is stored."""
        self._ensure_root()
        return FileChunkWriter(self._path(key, ""), self._reserve)

    def commit(self, key: str, writer: FileChunkWriter, info: PauseInfo,
               suffix: str) -> PauseInfo:
        """Make a written snapshot the key's, stored as ``suffix`` says (:data:`SUFFIXES`:
        as the pump stored it, or as another node did), with its info (its size and time
        added)."""
        if suffix not in SUFFIXES:
            writer.abort()
            raise SnapshotError(f"a snapshot stored as {suffix!r} cannot be read here")
        try:
            size = writer.commit(self._path(key, suffix))
            for other in SUFFIXES:  # an earlier snapshot of the key in another form
                if other != suffix:
                    self._path(key, other).unlink(missing_ok=True)
            info = info.model_copy(update={"image_bytes": size,
                                           "paused_at": datetime.now(UTC).isoformat()})
            _write_private(self._path(key, ".json"), info.model_dump_json().encode())
        except BaseException:
            self._path(key, suffix).unlink(missing_ok=True)
            raise
        return info

    def open_read(self, key: str) -> tuple[ChunkReader, str]:
        """The key's variables snapshot as stored, and how (its suffix)."""
        for suffix in SUFFIXES:
            path = self._path(key, suffix)
            if path.is_file():
                return FileChunkReader(path), suffix
        raise SnapshotError("the session's snapshot is missing")

    def copy(self, source: str, key: str, info: PauseInfo) -> PauseInfo:
        """The snapshot of ``source`` as ``key``'s too (a fork's paused copy), with ``info``."""
        reader, suffix = self.open_read(source)
        try:
            self._ensure_root()
            writer = FileChunkWriter(self._path(key, suffix), self._reserve)
            size = copy(reader, writer)
        finally:
            reader.close()
        info = info.model_copy(update={"image_bytes": size,
                                       "paused_at": datetime.now(UTC).isoformat()})
        try:
            _write_private(self._path(key, ".json"), info.model_dump_json().encode())
        except BaseException:
            self._path(key, suffix).unlink(missing_ok=True)
            raise
        return info

    def _snapshot_size(self, key: str) -> int:
        for suffix in SUFFIXES:
            with contextlib.suppress(OSError):
                return self._path(key, suffix).stat().st_size
        return 0

    def variables_only(self, key: str, info: PauseInfo) -> PauseInfo:
        """The key's memory pause ``info`` as its variables snapshot's alone, with that
        snapshot's size."""
        return info.without_memory().model_copy(
            update={"image_bytes": self._snapshot_size(key)})

    def remove_partials(self) -> int:
        """Remove the partial files (``*.part``) an earlier gateway, stopped or killed while
        writing them, left (blocking; before any write of this gateway); how many. Each is
        counted by :meth:`used_bytes` while it lies there, and nothing reads it."""
        if not self.root.is_dir():
            return 0
        removed = 0
        for path in self.root.glob("*.part"):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed += 1
        return removed

    def memory_stem(self, key: str) -> Path:
        """Where a backend writes the key's memory image (it adds its suffix), the folder made."""
        self._ensure_root()
        return self._path(key, MEMORY_INFIX)

    def memory_image(self, key: str) -> Path | None:
        """The key's memory image, if it has one."""
        found = sorted(self.root.glob(f"{self._path(key, MEMORY_INFIX).name}.*"))
        return next((path for path in found if not path.name.endswith(".part")), None)

    def hold_memory(self, key: str, size: int, info: PauseInfo) -> PauseInfo:
        """Count a memory dump of ``size`` bytes, not packed yet, against the budget and note
        the memory pause in the key's info (a gateway that stops before the packing ends
        finds no image, and resumes from the variables); :class:`SnapshotBudgetExceeded` when
        it does not fit (the caller discards the dump; the variables snapshot stays)."""
        with self._budget_lock:
            self._held.pop(key, None)
            used = self.used_bytes()
            if used + size > self.budget_bytes:
                self._used_at_most = used
                raise SnapshotBudgetExceeded(
                    f"the memory dump of {size} bytes does not fit in the budget of "
                    f"{self.budget_bytes} bytes (REPLGATE_SNAPSHOT_BUDGET)")
            self._held[key] = size
            self._used_at_most = used + size
        info = _with_memory(info, size)
        _write_private(self._path(key, ".json"), info.model_dump_json().encode())
        return info

    def drop_held(self, key: str) -> None:
        """The key's memory dump is gone (packed, restored or discarded): no longer counted."""
        with self._budget_lock:
            self._held.pop(key, None)

    def keep_memory(self, key: str, image: Path, info: PauseInfo) -> PauseInfo:
        """Count a memory image the backend wrote against the budget (in place of its dump,
        gone) and note it in the key's info (``info`` of the variables snapshot); over the
        budget it is deleted and :class:`SnapshotBudgetExceeded` raised (the variables
        snapshot stays)."""
        size = image.stat().st_size
        with self._budget_lock:
            self._held.pop(key, None)
            used = self.used_bytes()  # the image is in it already
            self._used_at_most = used
            if used > self.budget_bytes:
                image.unlink(missing_ok=True)
                self._used_at_most -= size
                raise SnapshotBudgetExceeded(
                    f"the memory image of {size} bytes does not fit in the budget of "
                    f"{self.budget_bytes} bytes (REPLGATE_SNAPSHOT_BUDGET)")
        info = _with_memory(info, size)
        _write_private(self._path(key, ".json"), info.model_dump_json().encode())
        return info

    def info(self, key: str) -> PauseInfo | None:
        try:
            return PauseInfo.model_validate_json(self._path(key, ".json").read_bytes())
        except (OSError, ValueError):
            return None

    def delete(self, key: str) -> None:
        self.drop_held(key)
        for suffix in (*SUFFIXES, ".json"):
            self._path(key, suffix).unlink(missing_ok=True)
        self.delete_memory(key)

    def save_info(self, key: str, info: PauseInfo) -> None:
        """Write the key's info again (a memory pause that fell back to its variables)."""
        _write_private(self._path(key, ".json"), info.model_dump_json().encode())

    def delete_memory(self, key: str) -> None:
        """Delete the key's memory image (its variables snapshot stays)."""
        self.drop_held(key)
        if self.root.is_dir():
            for path in self.root.glob(f"{self._path(key, MEMORY_INFIX).name}.*"):
                path.unlink(missing_ok=True)


def _with_memory(info: PauseInfo, size: int) -> PauseInfo:
    """The variables snapshot's info as a memory pause's, the memory's ``size`` added: what
    the variables lost the memory keeps (the code contexts it holds too), but for the shell
    commands and code contexts the pause stopped."""
    held = {context_entry(context.id) for context in info.contexts}
    stopped = {name: why for name, why in info.not_kept.items()
               if name.startswith((STOPPED_COMMAND, STOPPED_CONTEXT)) and name not in held}
    kept = [name for name in info.not_kept if name not in stopped]
    return info.model_copy(update={
        "paused_with": "memory", "image_bytes": info.image_bytes + size,
        "kept": [*info.kept, *kept], "not_kept": stopped,
        "variables_not_kept": {name: info.not_kept[name] for name in kept}})


def _write_private(path: Path, data: bytes) -> None:
    """Write ``path`` (0600) atomically; on failure no partial file is left, and
    :class:`SnapshotError` (:class:`SnapshotBudgetExceeded` on a full disk) gives the
    system's words without the path: the host's folders are not the tenant's to see."""
    partial = path.with_name(path.name + ".part")
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, path)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
    except OSError as exc:
        error = SnapshotBudgetExceeded if exc.errno in (errno.ENOSPC, errno.EDQUOT) \
            else SnapshotError
        raise error("the snapshot could not be written to the state directory: "
                    f"{exc.strerror or type(exc).__name__}") from exc


# -- the kernel side, through silent executions ---------------------------------------------

async def evaluate(kernel: Kernel, expression: str, timeout_s: float) -> Any:
    """Evaluate ``expression`` in the kernel as a user expression of a silent execution
    (no history, no namespace change); its value, read back from its ``repr``."""
    msg_id, route = kernel.request("execute_request", {
        "code": "", "silent": True, "store_history": False,
        "user_expressions": {"r": expression}, "allow_stdin": False, "stop_on_error": False})
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                channel, msg = await route.get()
                if channel == "died":
                    raise SnapshotError(f"the kernel died: {msg.reason}")
                if channel == "shell":
                    break
    except TimeoutError:
        raise SnapshotError(f"the kernel did not answer within {timeout_s:g}s") from None
    finally:
        kernel.forget(msg_id)
    result = (msg["content"].get("user_expressions") or {}).get("r") or {}
    if result.get("status") == "error" and result.get("ename") == "SnapshotRefused":
        raise SnapshotError(str(result.get("evalue", ""))[:500])  # a sentence of its own
    if result.get("status") != "ok":
        raise SnapshotError(f"{result.get('ename', 'error')}: {result.get('evalue', '')}"[:500])
    try:
        return ast.literal_eval(result["data"]["text/plain"])
    except (KeyError, ValueError, SyntaxError) as exc:
        raise SnapshotError(f"the kernel's answer was unreadable: {exc}") from exc


def _transfer_name() -> str:
    return f"{TRANSFER_NAME}-{secrets.token_hex(8)}"


async def save_variables(kernel: Kernel, store: SnapshotStore, key: str,
                         progress: Progress | None = None) -> PauseInfo:
    """Stream the kernel's variables into the store as ``key``'s snapshot; what was kept
    (with the snapshot's size). The kernel goes on unchanged, also when this fails."""
    writer = await anyio.to_thread.run_sync(store.open_write, key)
    try:
        info, suffix = await _save_stream(kernel, writer, progress)
        committed: PauseInfo = await anyio.to_thread.run_sync(store.commit, key, writer, info,
                                                              suffix)
    except BaseException:
        writer.abort()
        raise
    return committed


async def _save_stream(kernel: Kernel, writer: FileChunkWriter,
                       progress: Progress | None) -> tuple[PauseInfo, str]:
    """What the kernel kept, streamed into ``writer``, and how it was stored (its suffix)."""
    sandbox, name, pump = kernel.sandbox, _transfer_name(), Pump()
    folder = sandbox.pipe_folder
    save = "__import__('replgate_kernel.snapshot').snapshot.save({!r})"
    if folder is None:  # through a workspace file: written whole, then streamed
        try:
            answer = await evaluate(kernel, save.format(name), SNAPSHOT_TIMEOUT_S)
            suffix = await _in_thread(pump, _pump_out_file, sandbox.workspace, name, writer,
                                      pump, progress)
        finally:
            await anyio.to_thread.run_sync(_unlink_in, sandbox.workspace, name)
        return _kept(answer), suffix
    host = folder[0] / name
    source = await anyio.to_thread.run_sync(_open_read_end, host)
    pumping = asyncio.ensure_future(_in_thread(pump, _pump_out_pipe, source, writer, pump,
                                               progress))
    try:
        try:
            answer = await evaluate(kernel, save.format(f"{folder[1]}/{name}"),
                                    SNAPSHOT_TIMEOUT_S)
        except BaseException:
            failure = await _verdict(pump, pumping)
            if isinstance(failure, SnapshotBudgetExceeded):  # why the kernel's writes broke
                raise failure from None
            raise
        # The kernel has closed its end: what is left is the pipe's buffer and the codec's
        # flush. A process of the sandbox's own that holds the pipe open for writing would keep
        # the stream from ending: after PIPE_LINGER_S the pause is refused instead of held.
        done, _ = await asyncio.wait([pumping], timeout=PIPE_LINGER_S)
        if not done:
            failure = await _verdict(pump, pumping)  # its "stopped", retrieved
            raise SnapshotError("a process in the sandbox kept the snapshot's pipe open after "
                                "the kernel had written it; the pause was not taken") from failure
        suffix = pumping.result()
    finally:
        with contextlib.suppress(OSError):
            host.unlink()
    return _kept(answer), suffix


def _kept(answer: Any) -> PauseInfo:
    try:
        summary = json.loads(answer)
        return PauseInfo(kept=summary["kept"], not_kept=summary["not_kept"],
                         raw_bytes=int(summary.get("bytes") or 0))
    except (TypeError, ValueError, KeyError) as exc:
        raise SnapshotError(f"the kernel's answer was unreadable: {exc}") from exc


async def load_variables(kernel: Kernel, store: SnapshotStore, key: str, reseed: bool,
                         progress: Progress | None = None) -> None:
    """Stream ``key``'s snapshot into the kernel's namespace (``reseed``: fresh random
    generators, for a fork's copy)."""
    reader, suffix = await anyio.to_thread.run_sync(store.open_read, key)
    try:
        await _load_stream(kernel, reader, suffix, reseed, progress)
    finally:
        reader.close()


async def _load_stream(kernel: Kernel, reader: ChunkReader, suffix: str, reseed: bool,
                       progress: Progress | None) -> None:
    sandbox, name, pump = kernel.sandbox, _transfer_name(), Pump()
    folder = sandbox.pipe_folder
    load = "__import__('replgate_kernel.snapshot').snapshot.load({!r}, {!r})"
    if folder is None:  # through a workspace file: written whole, then loaded
        try:
            await _in_thread(pump, _pump_into_file, sandbox.workspace, name, reader, suffix,
                             pump, progress)
            await evaluate(kernel, load.format(name, reseed), SNAPSHOT_TIMEOUT_S)
        finally:
            await anyio.to_thread.run_sync(_unlink_in, sandbox.workspace, name)
        return
    host = folder[0] / name
    identity = await anyio.to_thread.run_sync(_make_pipe, host)
    pumping = asyncio.ensure_future(_in_thread(
        pump, _pump_into_pipe, host, identity, reader, suffix, pump, progress))
    try:
        try:
            await evaluate(kernel, load.format(f"{folder[1]}/{name}", reseed),
                           SNAPSHOT_TIMEOUT_S)
        except BaseException:
            failure = await _verdict(pump, pumping)
            if isinstance(failure, SnapshotError) and "kernel stopped" not in str(failure):
                raise failure from None  # the stored snapshot's fault, not the kernel's
            raise
        await asyncio.shield(pumping)
    finally:
        with contextlib.suppress(OSError):
            host.unlink()


async def _verdict(pump: Pump, pumping: asyncio.Future[Any]) -> BaseException | None:
    """Why the host's side of a snapshot's pipe failed, once the kernel's side has failed.

    The pump's own failure (a corrupt stored stream, the snapshot budget) also ends the
    kernel's side, and the kernel's error often arrives first: the pump is given a moment to
    end by itself (it does at once, the pipe's other end being gone) before it is stopped,
    which would silence it.
    """
    await asyncio.wait([pumping], timeout=PUMP_VERDICT_S)
    pump.stop()
    await asyncio.wait([pumping])
    return None if pumping.cancelled() else pumping.exception()


async def _in_thread(pump: Pump, func: Callable[..., Any], *args: Any) -> Any:
    """``func`` in a worker thread, its value; a cancellation stops the pump and waits for
    its end."""
    call = asyncio.ensure_future(anyio.to_thread.run_sync(func, *args))
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        pump.stop()
        await asyncio.wait([call])
        raise


# Pipes are made by the host in a folder the sandbox can write: each end is opened without
# following a link, and checked to be the very pipe made (a planted file is refused).

def _make_pipe(path: Path) -> tuple[int, int]:
    """Make the named pipe at ``path``, the kernel's to open; its identity (device, inode)."""
    os.mkfifo(path, 0o600)
    if os.geteuid() == 0:
        os.chown(path, SANDBOX_UID, SANDBOX_GID, follow_symlinks=False)
    made = os.lstat(path)
    return made.st_dev, made.st_ino


def _checked(fd: int, identity: tuple[int, int]) -> int:
    found = os.fstat(fd)
    if not stat.S_ISFIFO(found.st_mode) or (found.st_dev, found.st_ino) != identity:
        os.close(fd)
        raise SnapshotError("the snapshot's pipe was replaced in the sandbox")
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    return fd


def _open_read_end(path: Path) -> int:
    """Make the pipe and open its reading end (without waiting for a writer)."""
    identity = _make_pipe(path)
    try:
        return _checked(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW), identity)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def _pump_out_pipe(source: int, writer: FileChunkWriter, pump: Pump,
                   progress: Progress | None) -> str:
    """Wait for the kernel to open the pipe (until then a read would see its end), then
    move its stream into storage."""
    poller = select.poll()
    poller.register(source, select.POLLIN | select.POLLHUP)
    while not poller.poll(int(PIPE_WAIT_S * 1000)):
        if pump.stopped:
            os.close(source)
            raise SnapshotError("the snapshot was stopped")
    os.set_blocking(source, True)
    return pump.out(source, writer, progress)


def _pump_into_pipe(path: Path, identity: tuple[int, int], reader: ChunkReader, suffix: str,
                    pump: Pump, progress: Progress | None) -> None:
    """Wait for the kernel to open the pipe for reading, then feed it the stream."""
    while True:
        try:
            target = _checked(os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW),
                              identity)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise SnapshotError(f"the snapshot's pipe cannot be opened: {exc}") from exc
        if pump.stopped:
            raise SnapshotError("the snapshot was stopped")
        pump.wait(PIPE_WAIT_S)
    os.set_blocking(target, True)
    pump.into(reader, suffix, target, progress)


def _pump_out_file(workspace: Workspace, name: str, writer: FileChunkWriter, pump: Pump,
                   progress: Progress | None) -> str:
    with workspace.access():
        fd = _open_in(workspace, name, os.O_RDONLY)
        return pump.out(fd, writer, progress)


def _pump_into_file(workspace: Workspace, name: str, reader: ChunkReader, suffix: str,
                    pump: Pump, progress: Progress | None) -> None:
    with workspace.access(write=True):
        fd = _open_in(workspace, name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            if os.geteuid() == 0:
                os.fchown(fd, SANDBOX_UID, SANDBOX_GID)
        except BaseException:
            os.close(fd)
            raise
        try:
            pump.into(reader, suffix, fd, progress)
        except OSError as exc:
            raise SnapshotError(f"the variables do not fit in the workspace: {exc}") from exc


def _open_in(workspace: Workspace, name: str, flags: int) -> int:
    """A regular file at the top of the workspace, never through a link (nor a FIFO's wait)."""
    try:
        fd = os.open(workspace.root / name, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        raise SnapshotError(f"the snapshot's file in the workspace cannot be opened: "
                            f"{exc.strerror or exc}") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SnapshotError("the snapshot's file in the workspace was replaced")
    os.set_blocking(fd, True)
    return fd


def _unlink_in(workspace: Workspace, name: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(workspace.root / name)  # unlink never follows a link


# -- workspace copies for forks --------------------------------------------------------------

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
