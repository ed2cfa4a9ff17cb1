"""E2B's files beyond ``/home/user``: the rest of the sandbox's file system, as its user sees it.

``/home/user`` (the workspace) is served from the host's side (:mod:`gateway.e2b._paths`).
Any other absolute path (``/tmp/test-git``, ``/etc/hostname``, ``/proc/...``) goes through the
sandbox's container, as the sandbox's user (:meth:`~kernel_pool.SessionPort.sandbox_fs` and
its read and write), so E2B's files API gives nothing code in the sandbox could not already
do: a read-only system folder or root's file answers permission denied, and nothing outside
the container is reached. Downloads and raw uploads stream, under the same limits as the
workspace's; what the sandbox refuses comes back in E2B's shapes (HTTP statuses on envd's
``/files``, Connect codes on the filesystem service).

The filesystem service's and ``/files``' handlers ask :func:`in_sandbox` first, then call here.
"""

from __future__ import annotations

import posixpath
import stat
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from fastapi import Request
from fastapi.responses import StreamingResponse

from common.streams import primed
from gateway.e2b._connect import TARGET
from gateway.e2b._errors import E2BError
from gateway.e2b._paths import HOME
from gateway.service import upload_too_large
from kernel_pool import (
    InvalidRequest,
    SandboxEntry,
    SandboxFileDenied,
    SandboxFileError,
    SandboxFileExists,
    SandboxFileMissing,
    SandboxFsRequest,
    SessionPort,
)

T = TypeVar("T")
_CODES: list[tuple[type[Exception], Code]] = [
    (SandboxFileMissing, Code.NOT_FOUND), (SandboxFileDenied, Code.PERMISSION_DENIED),
    (SandboxFileExists, Code.ALREADY_EXISTS), (InvalidRequest, Code.INVALID_ARGUMENT),
    (SandboxFileError, Code.FAILED_PRECONDITION)]
_TYPES = {"file": "FILE_TYPE_FILE", "dir": "FILE_TYPE_DIRECTORY",
          "symlink": "FILE_TYPE_SYMLINK", "other": "FILE_TYPE_UNSPECIFIED"}
_USERS = {0: "root", 1000: "user"}
"""The image's users (``user`` is the sandbox's, uid 1000); others are shown by number."""


def _normal(path: str) -> str:
    return posixpath.normpath(path).replace("//", "/", 1)


def in_sandbox(path: str) -> bool:
    """True for an absolute path outside ``/home/user``: served through the container."""
    if not path.startswith("/") or "\x00" in path:
        return False  # relative, ``~``: the workspace's (a NUL is refused there)
    normal = _normal(path)
    return normal != HOME and not normal.startswith(HOME + "/")


def _absolute(path: str) -> str:
    """A path of a request as the sandbox names it (relative ones are under ``/home/user``)."""
    if path.startswith("~"):
        path = HOME + path[1:]
    return _normal(path if path.startswith("/") else f"{HOME}/{path}")


def entry_fields(entry: SandboxEntry) -> dict[str, Any]:
    """An entry as envd's ``EntryInfo`` (its fields by name)."""
    kind_bits = {"dir": stat.S_IFDIR, "symlink": stat.S_IFLNK}.get(entry.kind, stat.S_IFREG)
    target = entry.resolved
    if target is None and entry.target is not None:  # a link described as itself
        target = _normal(posixpath.join(posixpath.dirname(entry.path), entry.target))
    return {"name": posixpath.basename(entry.path) or "/", "type": _TYPES[entry.kind],
            "path": entry.path, "size": str(entry.size), "mode": entry.mode,
            "permissions": stat.filemode(kind_bits | entry.mode),
            "owner": _USERS.get(entry.owner, str(entry.owner)),
            "group": _USERS.get(entry.group, str(entry.group)),
            "modified_time": datetime.fromtimestamp(entry.modified, UTC).isoformat().replace(
                "+00:00", "Z"),
            "symlink_target": target}


async def _in_sandbox(operation: Callable[[SessionPort], Awaitable[T]]) -> T:
    """An operation on the target session's files, its refusals as Connect's errors."""
    try:
        return await operation(TARGET.get().session)
    except (SandboxFileError, InvalidRequest) as exc:
        code = next(code for kind, code in _CODES if isinstance(exc, kind))
        raise ConnectError(code, str(exc)) from None


async def _entry(request: SandboxFsRequest) -> dict[str, Any]:
    answer = await _in_sandbox(lambda s: s.sandbox_fs(request))
    if answer.entry is None:
        raise ConnectError(Code.INTERNAL, f"the sandbox did not describe {request.path!r}")
    return entry_fields(answer.entry)


async def stat_entry(path: str) -> dict[str, Any]:
    """Filesystem.Stat of a path of the sandbox: its ``EntryInfo``."""
    return await _entry(SandboxFsRequest(op="stat", path=_absolute(path)))


async def list_dir(path: str, depth: int) -> list[dict[str, Any]]:
    """Filesystem.ListDir: the entries ``depth`` levels down, depth-first."""
    request = SandboxFsRequest(op="list", path=_absolute(path), depth=min(max(1, depth), 64))
    answer = await _in_sandbox(lambda s: s.sandbox_fs(request))
    return [entry_fields(entry) for entry in answer.entries or []]


async def make_dir(path: str) -> dict[str, Any]:
    """Filesystem.MakeDir (parents too); ALREADY_EXISTS for a folder already there."""
    request = SandboxFsRequest(op="mkdir", path=_absolute(path))
    answer = await _in_sandbox(lambda s: s.sandbox_fs(request))
    if not answer.created or answer.entry is None:
        raise ConnectError(Code.ALREADY_EXISTS, f"{path!r} already exists")
    return entry_fields(answer.entry)


async def move(source: str, destination: str) -> dict[str, Any]:
    """Filesystem.Move (either side may be in ``/home/user``: both are in the container)."""
    return await _entry(SandboxFsRequest(op="move", path=_absolute(source),
                                         destination=_absolute(destination)))


async def remove(path: str) -> None:
    """Filesystem.Remove: nothing there is no error, as envd's ``os.RemoveAll``."""
    try:
        await _in_sandbox(lambda s: s.sandbox_fs(SandboxFsRequest(op="remove",
                                                                  path=_absolute(path))))
    except ConnectError as exc:
        if exc.code != Code.NOT_FOUND:
            raise


async def download(session: SessionPort, path: str, limit: int) -> StreamingResponse:
    """envd's ``GET /files`` of a path of the sandbox, streamed; its refusal (raised before
    the answer starts) answered in E2B's shape by the route."""
    body = await primed(session.sandbox_read(_absolute(path), limit))
    return StreamingResponse(body, media_type="application/octet-stream")


async def _capped(request: Request, limit: int) -> AsyncIterator[bytes]:
    """The raw body as it comes (inflated when gzipped), refused once over ``limit`` bytes."""
    declared = request.headers.get("content-length")
    encoding = request.headers.get("content-encoding", "identity").lower()
    if encoding == "identity" and declared and declared.isdigit() and int(declared) > limit:
        raise upload_too_large(limit)
    if encoding not in ("identity", "gzip"):
        raise E2BError(400, f"Content-Encoding {encoding!r} is not accepted; send gzip or "
                            "the file as it is")
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if encoding == "gzip" else None
    size = 0
    async for chunk in request.stream():
        if inflate is not None:
            try:  # at most limit + 1 bytes out of each piece: a bomb stops here
                chunk = inflate.decompress(chunk, limit + 1 - size)
            except zlib.error as exc:
                raise E2BError(400, f"the gzip body is broken: {exc}") from None
            if inflate.unconsumed_tail:
                raise upload_too_large(limit)
        size += len(chunk)
        if size > limit:
            raise upload_too_large(limit)
        yield chunk
    if inflate is not None and not inflate.eof:
        raise E2BError(400, "the gzip body ended before its end")


def _written(entry: SandboxEntry) -> dict[str, Any]:
    return {"name": posixpath.basename(entry.path), "type": "file", "path": entry.path}


async def upload(request: Request, session: SessionPort, path: str,
                 limit: int) -> list[dict[str, Any]]:
    """envd's raw ``POST /files?path=`` to a path of the sandbox, streamed into it."""
    return [_written(await session.sandbox_write(_absolute(path), _capped(request, limit)))]


async def upload_part(session: SessionPort, path: str, data: bytes) -> dict[str, Any]:
    """One file of a multipart upload (read under the limit already) to a path of the
    sandbox."""
    async def whole() -> AsyncIterator[bytes]:
        yield data

    return _written(await session.sandbox_write(_absolute(path), whole()))
