"""A kernel's variables in and out of it: the snapshot the kernel writes (dill, by
``replgate_kernel.snapshot`` in the sandbox image) streamed through a named pipe in the
sandbox's socket folder (a hidden file in its workspace where a pipe cannot cross, under
gVisor) and compressed on the way, and the same stream loaded back; each through a silent
execution (:func:`evaluate`). :mod:`kernel_pool._snapshot` keeps the streams on disk.
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
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from kernel_pool._chunk_files import FileChunkWriter
from kernel_pool._disk import SANDBOX_GID, SANDBOX_UID
from kernel_pool._streams import ChunkReader, Progress, Pump
from kernel_pool._workspace import Workspace
from kernel_pool.exceptions import SnapshotBudgetExceeded, SnapshotError
from kernel_pool.state import PauseInfo

if TYPE_CHECKING:
    from kernel_pool._kernel import Kernel

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



async def save_stream(kernel: Kernel, writer: FileChunkWriter,
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



async def load_stream(kernel: Kernel, reader: ChunkReader, suffix: str, reseed: bool,
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
