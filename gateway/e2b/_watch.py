"""envd's folder watching (``filesystem.Filesystem``): ``WatchDir``, a server stream, and the
polling watchers the SDKs' sync face uses, ``CreateWatcher`` / ``GetWatcherEvents`` /
``RemoveWatcher``; both on the session port's ``watch_dir`` (inotify in the sandbox).

Events restate envd's ``FilesystemEvent``: ``name`` relative to the watched folder, ``type``
``EVENT_TYPE_CREATE`` ... ``EVENT_TYPE_CHMOD``, ``entry`` (``include_entry``) the path's
EntryInfo when it still exists. ``WatchDir`` sends ``start`` once the watch is in place, a
``keepalive`` when quiet, and ends without an error when the watch ends (the sandbox paused or
was killed): the SDK's ``on_exit(None)``. A poll first asks the watch to flush, so a file the
client wrote just before is in the answer. Polling watchers live in this gateway's memory: a
poll must reach the gateway that made the watcher (a watcher another gateway made, or one
removed, is NOT_FOUND); one not polled for :data:`WATCHER_IDLE_S` is removed.
``allow_network_mounts`` changes nothing: the workspace is a local filesystem.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext

from gateway.e2b._connect import TARGET, ProtoJSON, server_stream, unary
from gateway.e2b._errors import E2BError
from gateway.e2b._filesystem import EntryInfo, entry_info
from gateway.e2b._paths import to_workspace
from kernel_pool import (
    DirWatch,
    FileMissing,
    KernelPoolError,
    SessionClosed,
    TooManyWatches,
    WatchEvent,
    WorkspaceError,
)

KEEPALIVE_S = 30.0
"""How long a quiet ``WatchDir`` stream waits before a ``keepalive`` (the SDK's ping is 50 s)."""
WATCHER_IDLE_S = 600.0
"""A polling watcher not polled this long is removed (its client went without removing it)."""

EventType = Literal["EVENT_TYPE_UNSPECIFIED", "EVENT_TYPE_CREATE", "EVENT_TYPE_WRITE",
                    "EVENT_TYPE_REMOVE", "EVENT_TYPE_RENAME", "EVENT_TYPE_CHMOD"]


class WatchRequest(ProtoJSON):
    path: str = ""
    recursive: bool = False
    include_entry: bool = False
    allow_network_mounts: bool = False


class FilesystemEvent(ProtoJSON):
    name: str
    type: EventType
    entry: EntryInfo | None = None


class Nothing(ProtoJSON):
    pass


class WatchDirResponse(ProtoJSON):
    start: Nothing | None = None
    filesystem: FilesystemEvent | None = None
    keepalive: Nothing | None = None


class WatcherId(ProtoJSON):
    watcher_id: str = ""


class WatcherEvents(ProtoJSON):
    events: list[FilesystemEvent]


_TYPES: dict[str, EventType] = {
    "create": "EVENT_TYPE_CREATE", "write": "EVENT_TYPE_WRITE", "remove": "EVENT_TYPE_REMOVE",
    "rename": "EVENT_TYPE_RENAME", "chmod": "EVENT_TYPE_CHMOD"}


def _event(event: WatchEvent, include_entry: bool) -> FilesystemEvent:
    kind = _TYPES.get(event.type, "EVENT_TYPE_UNSPECIFIED")
    entry = entry_info(event.entry) if include_entry and event.entry is not None else None
    return FilesystemEvent(name=event.name, type=kind, entry=entry)


async def _watch(request: WatchRequest) -> DirWatch:
    """The target sandbox's watch of the request's folder; refusals as envd's codes."""
    try:
        path = to_workspace(request.path)
    except E2BError as exc:
        raise ConnectError(Code.INVALID_ARGUMENT, exc.message) from None
    try:
        return await TARGET.get().session.watch_dir(path, request.recursive)
    except FileMissing:
        raise ConnectError(Code.NOT_FOUND, f"folder {request.path!r} not found") from None
    except WorkspaceError as exc:
        raise ConnectError(Code.INVALID_ARGUMENT, str(exc)) from None
    except TooManyWatches as exc:
        raise ConnectError(Code.RESOURCE_EXHAUSTED, str(exc)) from None
    except SessionClosed as exc:
        raise ConnectError(Code.NOT_FOUND, str(exc)) from None
    except KernelPoolError as exc:
        raise ConnectError(Code.UNAVAILABLE, str(exc)) from None


async def watch_dir(request: WatchRequest, _ctx: RequestContext[Any, Any]
                    ) -> AsyncIterator[WatchDirResponse]:
    watch = await _watch(request)
    try:
        yield WatchDirResponse(start=Nothing())
        events = aiter(watch)
        while True:
            try:
                event = await asyncio.wait_for(anext(events), KEEPALIVE_S)
            except TimeoutError:
                yield WatchDirResponse(keepalive=Nothing())
                continue
            except StopAsyncIteration:
                return
            if event.type == "end":
                return
            yield WatchDirResponse(filesystem=_event(event, request.include_entry))
    finally:
        await watch.close("the client stopped watching")


@dataclass
class _Watcher:
    tenant: str
    session_id: str
    watch: DirWatch
    include_entry: bool
    polled: float = field(default_factory=time.monotonic)


class Watchers:
    """The polling watchers of this gateway, by id."""

    def __init__(self) -> None:
        self._watchers: dict[str, _Watcher] = {}

    async def create(self, request: WatchRequest) -> WatcherId:
        await self._expire()
        watch = await _watch(request)
        target = TARGET.get()
        self._watchers[watch.id] = _Watcher(target.tenant, target.session.id, watch,
                                            request.include_entry)
        return WatcherId(watcher_id=watch.id)

    async def events(self, request: WatcherId) -> WatcherEvents:
        watcher = self._find(request.watcher_id)
        watcher.polled = time.monotonic()
        await watcher.watch.flush()
        return WatcherEvents(events=[_event(e, watcher.include_entry)
                                     for e in watcher.watch.take() if e.type != "end"])

    async def remove(self, request: WatcherId) -> Nothing:
        watcher = self._find(request.watcher_id)
        del self._watchers[request.watcher_id]
        await watcher.watch.close("the watcher was removed")
        return Nothing()

    def _find(self, watcher_id: str) -> _Watcher:
        target = TARGET.get()
        watcher = self._watchers.get(watcher_id)
        if watcher is None or (watcher.tenant, watcher.session_id) != (
                target.tenant, target.session.id):
            raise ConnectError(Code.NOT_FOUND, f"watcher {watcher_id!r} not found")
        return watcher

    async def _expire(self) -> None:
        now = time.monotonic()
        for watcher_id, watcher in list(self._watchers.items()):
            if now - watcher.polled > WATCHER_IDLE_S:
                del self._watchers[watcher_id]
                with contextlib.suppress(Exception):
                    await watcher.watch.close("the watcher was not polled for too long")


def watch_endpoints(service: str) -> list[tuple[str, Any]]:
    """The four watching methods of ``service`` (envd's ``filesystem.Filesystem``)."""
    watchers = Watchers()
    return [
        server_stream(service, "WatchDir", WatchRequest, WatchDirResponse, watch_dir),
        unary(service, "CreateWatcher", WatchRequest, WatcherId, watchers.create),
        unary(service, "GetWatcherEvents", WatcherId, WatcherEvents, watchers.events),
        unary(service, "RemoveWatcher", WatcherId, Nothing, watchers.remove),
    ]
