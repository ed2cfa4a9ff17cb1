"""envd's ``filesystem.Filesystem`` service on the session's workspace (``/home/user``).

Messages restate envd's public interface in ProtoJSON (``filesystem.proto``: EntryInfo, Stat,
ListDir, MakeDir, Move, Remove); watching folders is :mod:`gateway.e2b._watch`'s.

As envd does, an entry that is a link describes what it leads to (its type, size, mode) with
``symlinkTarget`` the absolute path it resolves to, and ``isSymlink`` left false (the newest
SDKs would otherwise call it a link, the test suite's older ones a file). A link leading out
of ``/home/user``, nowhere, or in a loop is described as itself (``FILE_TYPE_SYMLINK``, its
own size, ``symlinkTarget`` its text made absolute): nothing outside the workspace is read.
Removing what does not exist succeeds, as envd's ``os.RemoveAll`` does.
"""

from __future__ import annotations

import posixpath
import stat
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from connectrpc.code import Code
from connectrpc.errors import ConnectError

from gateway.e2b import _sandbox_paths as sandbox
from gateway.e2b._connect import (
    TARGET,
    ConnectService,
    Empty,
    ProtoJSON,
    unary,
)
from gateway.e2b._errors import E2BError
from gateway.e2b._paths import to_e2b, to_workspace
from gateway.e2b._sandbox_paths import in_sandbox
from kernel_pool import Entry, FileMissing, SessionPort, WorkspaceError

SERVICE = "filesystem.Filesystem"
T = TypeVar("T")

FileType = Literal["FILE_TYPE_UNSPECIFIED", "FILE_TYPE_FILE", "FILE_TYPE_DIRECTORY",
                   "FILE_TYPE_SYMLINK"]
_TYPES: dict[str, FileType] = {"file": "FILE_TYPE_FILE", "dir": "FILE_TYPE_DIRECTORY",
                               "symlink": "FILE_TYPE_SYMLINK", "other": "FILE_TYPE_UNSPECIFIED"}


class EntryInfo(ProtoJSON):
    name: str
    type: FileType
    path: str
    size: str
    """int64: a string in ProtoJSON."""
    mode: int
    permissions: str
    owner: str = "user"
    group: str = "user"
    modified_time: str
    symlink_target: str | None = None
    metadata: dict[str, str] | None = None


class PathRequest(ProtoJSON):
    path: str = ""


class ListDirRequest(ProtoJSON):
    path: str = ""
    depth: int = 0


class MoveRequest(ProtoJSON):
    source: str = ""
    destination: str = ""


class EntryResponse(ProtoJSON):
    entry: EntryInfo


class ListDirResponse(ProtoJSON):
    entries: list[EntryInfo]


def entry_info(entry: Entry) -> EntryInfo:
    kind_bits = {"dir": stat.S_IFDIR, "symlink": stat.S_IFLNK}.get(entry.kind, stat.S_IFREG)
    target = None
    if entry.resolved is not None:
        target = to_e2b(entry.resolved)
    elif entry.target is not None:  # described as itself: where its text points
        target = posixpath.normpath(posixpath.join(posixpath.dirname(to_e2b(entry.path)),
                                                   entry.target))
    return EntryInfo(
        name=entry.path.rsplit("/", 1)[-1] if entry.path else "user",
        type=_TYPES[entry.kind], path=to_e2b(entry.path), size=str(entry.size),
        mode=entry.mode, permissions=stat.filemode(kind_bits | entry.mode),
        modified_time=datetime.fromtimestamp(entry.modified, UTC).isoformat().replace(
            "+00:00", "Z"),
        symlink_target=target, metadata=entry.metadata)


async def _on_workspace(operation: Callable[[SessionPort], Awaitable[T]]) -> T:
    """A workspace operation of the target session, its errors as Connect's."""
    try:
        return await operation(TARGET.get().session)
    except FileMissing as exc:
        raise ConnectError(Code.NOT_FOUND, str(exc)) from None
    except WorkspaceError as exc:
        raise ConnectError(Code.INVALID_ARGUMENT, str(exc)) from None


def _path(path: str) -> str:
    try:
        return to_workspace(path)
    except E2BError as exc:
        raise ConnectError(Code.INVALID_ARGUMENT, exc.message) from None


async def stat_entry(request: PathRequest) -> EntryResponse:
    if in_sandbox(request.path):
        return EntryResponse.model_validate({"entry": await sandbox.stat_entry(request.path)})
    path = _path(request.path)
    return EntryResponse(entry=entry_info(await _on_workspace(lambda s: s.stat_path(path))))


async def list_dir(request: ListDirRequest) -> ListDirResponse:
    if in_sandbox(request.path):
        return ListDirResponse.model_validate(
            {"entries": await sandbox.list_dir(request.path, request.depth)})
    path, depth = _path(request.path), max(1, request.depth)
    entries = await _on_workspace(lambda s: s.list_dir(path, depth))
    return ListDirResponse(entries=[entry_info(e) for e in entries])


async def make_dir(request: PathRequest) -> EntryResponse:
    if in_sandbox(request.path):
        return EntryResponse.model_validate({"entry": await sandbox.make_dir(request.path)})
    path = _path(request.path)
    if not await _on_workspace(lambda s: s.make_dir(path)):
        raise ConnectError(Code.ALREADY_EXISTS, f"{request.path!r} already exists")
    return EntryResponse(entry=entry_info(await _on_workspace(lambda s: s.stat_path(path))))


async def move(request: MoveRequest) -> EntryResponse:
    if in_sandbox(request.source) or in_sandbox(request.destination):
        return EntryResponse.model_validate(
            {"entry": await sandbox.move(request.source, request.destination)})
    source, destination = _path(request.source), _path(request.destination)
    return EntryResponse(entry=entry_info(
        await _on_workspace(lambda s: s.move_path(source, destination))))


async def remove(request: PathRequest) -> Empty:
    if in_sandbox(request.path):
        await sandbox.remove(request.path)
        return Empty()
    path = _path(request.path)
    try:
        await _on_workspace(lambda s: s.remove_path(path))
    except ConnectError as exc:
        if exc.code != Code.NOT_FOUND:
            raise
    return Empty()


def filesystem_service(*watching: tuple[str, Any]) -> ConnectService:
    """The service; ``watching``: its folder-watching methods (``_watch.watch_endpoints``)."""
    return ConnectService(SERVICE, dict([
        unary(SERVICE, "Stat", PathRequest, EntryResponse, stat_entry),
        unary(SERVICE, "ListDir", ListDirRequest, ListDirResponse, list_dir),
        unary(SERVICE, "MakeDir", PathRequest, EntryResponse, make_dir),
        unary(SERVICE, "Move", MoveRequest, EntryResponse, move),
        unary(SERVICE, "Remove", PathRequest, Empty, remove),
        *watching,
    ]))
