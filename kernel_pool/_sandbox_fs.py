"""The sandbox's own file system, beyond its workspace: ``/tmp``, ``/etc``, ``/proc``, ...

The workspace (``/home/user``) is served from the host's side; every other absolute path is
reached through the sandbox's container, by its file program (``replgate_kernel/fsop.py``) run
as the sandbox's user beside the kernel. So it can do no more than code in the sandbox could:
a read-only system folder refuses a write (:class:`SandboxFileDenied`), ``/proc`` shows the
sandbox's own processes, and nothing outside the container is reached. A read streams the file
(at most the download limit: :class:`FileTooLarge`), a write streams what it is given to its
end. A paused session is resumed first, as a shell command resumes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import posixpath
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator
from typing import Any

from kernel_pool._resuming import SessionResuming
from kernel_pool._sandbox_files import SandboxEntry, SandboxFsAnswer, SandboxFsRequest
from kernel_pool.backends.base import CommandProcess, Sandbox
from kernel_pool.exceptions import (
    BackendError,
    FileTooLarge,
    InvalidRequest,
    SandboxDiskFull,
    SandboxFileDenied,
    SandboxFileError,
    SandboxFileExists,
    SandboxFileMissing,
    SessionClosed,
)
from kernel_pool.state import SessionStatus

FILE_OP_TIMEOUT_S = 60.0
"""How long an operation (or a read's first answer, or a write's after its last byte) may take
before it is stopped: a path on a slow mount cannot hold a request forever."""
_REFUSALS: dict[str, type[SandboxFileError]] = {
    "missing": SandboxFileMissing, "denied": SandboxFileDenied, "exists": SandboxFileExists,
    "no_space": SandboxDiskFull}


def sandbox_path(path: str) -> str:
    """``path`` normalized; :class:`InvalidRequest` unless it is absolute."""
    if "\x00" in path:
        raise InvalidRequest("a path cannot contain a NUL character")
    if not path.startswith("/"):
        raise InvalidRequest(f"path {path!r} is not absolute: name a path of the sandbox "
                             "from its root, e.g. /tmp/data.csv")
    return posixpath.normpath(path).replace("//", "/", 1)


def _args(request: SandboxFsRequest) -> list[str]:
    path = sandbox_path(request.path)
    if request.op == "move":
        if request.destination is None:
            raise InvalidRequest("move needs its destination")
        return ["move", path, sandbox_path(request.destination)]
    if request.op == "list":
        return ["list", path, str(request.depth)]
    return [request.op, path]


class _Answer:
    """The file program's output: its first line (the JSON answer), then a read's bytes."""

    def __init__(self, process: CommandProcess) -> None:
        self.process = process
        self.rest = b""

    async def head(self, path: str) -> dict[str, Any]:
        """The answer line; its refusal raised as the pool's error."""
        line = bytearray()
        while True:
            piece = await self.process.read()
            if piece is None:
                raise SandboxFileError(path, f"{path!r}: the sandbox ended the file operation "
                                             "without an answer")
            stream, data = piece
            if stream != "stdout":
                continue
            line += data
            end = line.find(b"\n")
            if end >= 0:
                self.rest = bytes(line[end + 1:])
                answer: dict[str, Any] = json.loads(line[:end])
                _refuse(answer, path)
                return answer

    async def body(self) -> AsyncIterator[bytes]:
        """The bytes after the answer line."""
        if self.rest:
            yield self.rest
        while (piece := await self.process.read()) is not None:
            if piece[0] == "stdout" and piece[1]:
                yield piece[1]


def _refuse(answer: dict[str, Any], path: str) -> None:
    kind = answer.get("error")
    if kind is None:
        return
    message = str(answer.get("message", kind))
    if kind == "too_large":
        figures = json.loads(message)
        raise FileTooLarge(path, int(figures["size"]), int(figures["limit"]))
    raise _REFUSALS.get(str(kind), SandboxFileError)(path, message)


async def _ended(process: CommandProcess) -> None:
    """Stop the program if it still runs, and release it (also when the caller is cancelled)."""
    with contextlib.suppress(BackendError):
        await asyncio.shield(process.kill())
    with contextlib.suppress(Exception):
        await process.close()


async def file_op(sandbox: Sandbox, request: SandboxFsRequest) -> SandboxFsAnswer:
    """Run one operation in the sandbox; its answer, or its refusal raised."""
    args = _args(request)
    process = await sandbox.start_file_op(args)
    try:
        async with asyncio.timeout(FILE_OP_TIMEOUT_S):
            return SandboxFsAnswer.model_validate(await _Answer(process).head(args[1]))
    except TimeoutError:
        raise SandboxFileError(args[1], f"{args[1]!r}: the sandbox did not answer within "
                                        f"{FILE_OP_TIMEOUT_S:.0f} s") from None
    finally:
        await _ended(process)


async def read_file(sandbox: Sandbox, path: str, limit: int) -> AsyncGenerator[bytes, None]:
    """The file's bytes as they come; its refusal raised before the first piece, which may be
    empty (an empty file)."""
    path = sandbox_path(path)
    process = await sandbox.start_file_op(["read", path, str(max(0, limit))])
    try:
        answer = _Answer(process)
        try:
            async with asyncio.timeout(FILE_OP_TIMEOUT_S):
                await answer.head(path)
        except TimeoutError:
            raise SandboxFileError(path, f"{path!r}: the sandbox did not start reading it "
                                         f"within {FILE_OP_TIMEOUT_S:.0f} s") from None
        yield b""
        async for chunk in answer.body():
            yield chunk
    finally:
        await _ended(process)


async def write_file(sandbox: Sandbox, path: str,
                     chunks: AsyncIterable[bytes]) -> SandboxEntry:
    """Create or replace the file (its parents made) with ``chunks`` to their end. If they
    break off (raise), the program is stopped and removes the file it had just created."""
    path = sandbox_path(path)
    process = await sandbox.start_file_op(["write", path], stdin=True)
    try:
        async for chunk in chunks:
            try:
                await process.write(chunk)
            except BackendError:
                break  # it refused and ended: its answer says why
        await process.close_input()
        try:
            async with asyncio.timeout(FILE_OP_TIMEOUT_S):
                answer = SandboxFsAnswer.model_validate(await _Answer(process).head(path))
        except TimeoutError:
            raise SandboxFileError(path, f"{path!r}: the sandbox did not finish writing it "
                                         f"within {FILE_OP_TIMEOUT_S:.0f} s") from None
    finally:
        await _ended(process)  # SIGTERM first: a write broken off removes what it made
    if answer.entry is None:
        raise SandboxFileError(path, f"{path!r}: the sandbox wrote it but did not describe it")
    return answer.entry


class SessionSandboxFs(SessionResuming):
    """A local session's :class:`~kernel_pool.SessionPort` methods for the sandbox's files."""

    async def _file_sandbox(self) -> Sandbox:
        """The running sandbox, once a paused session is resumed."""
        if self._closed or self.status is SessionStatus.DEAD:
            raise SessionClosed(self.id)
        if self.paused:  # its files outside the workspace are in the container: bring it back
            await self.resume()
        self._touch()
        return self.kernel.sandbox

    async def sandbox_fs(self, request: SandboxFsRequest) -> SandboxFsAnswer:
        """Stat, list, make, remove or move a path of the sandbox's own file system."""
        return await file_op(await self._file_sandbox(), request)

    async def sandbox_read(self, path: str, limit: int) -> AsyncGenerator[bytes, None]:
        """A file of the sandbox, streamed (see :func:`read_file`)."""
        async for chunk in read_file(await self._file_sandbox(), path, limit):
            yield chunk

    async def sandbox_write(self, path: str, chunks: AsyncIterable[bytes]) -> SandboxEntry:
        """Write a file of the sandbox from ``chunks`` (see :func:`write_file`)."""
        return await write_file(await self._file_sandbox(), path, chunks)
