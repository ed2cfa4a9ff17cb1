"""Watching a folder of a session's workspace: its changes as :class:`WatchEvent`, in order.

A :class:`DirWatch` is what ``SessionPort.watch_dir`` answers once the watch is in place (a
change made after the call returned is seen). Iterated, it yields each change, then one last
``end`` event (with its ``reason``: the session paused or was deleted, the folder went, the
node was lost, the consumer lagged, or the watch was closed), then stops: a watch never ends
with an error. Between its source and its consumer it holds at most ``limit`` events; a
consumer that falls that far behind gets the ``end`` event saying it lagged.

A poller (E2B's ``GetWatcherEvents``) calls :meth:`DirWatch.flush`, then :meth:`DirWatch.take`:
the flush asks the sandbox's watcher for a ``sync`` marker and waits for it, so a change made
before the flush (a file the client wrote just before) is in what ``take`` returns.

:class:`SandboxWatch` reads the watcher program in the sandbox
(``sandbox_image/replgate_kernel/watch.py``, inotify) started beside the kernel like a command;
``node.remote_watch`` serves the same over a node's stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import uuid
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from kernel_pool._entries import Entry
from kernel_pool.backends.base import CommandProcess
from kernel_pool.exceptions import BackendError, FileMissing, WorkspaceError

logger = logging.getLogger(__name__)

WATCH_QUEUE = 4096
"""Events a watch holds for its consumer; one that falls further behind ends it (lagged)."""
FLUSH_TIMEOUT_S = 2.0
"""How long :meth:`DirWatch.flush` waits for the watcher's marker before answering anyway."""
START_TIMEOUT_S = 30.0
"""How long the watcher has to put its watches in place (a large tree takes a while)."""

WatchType = Literal["create", "write", "remove", "rename", "chmod", "end", "sync"]
LAGGED = "lagged: its consumer fell {} events behind; watch again"


class WatchEvent(BaseModel):
    """A change in a watched folder (fsnotify's kinds, as E2B's envd names them), or its end."""

    type: WatchType
    """``create`` (made or moved in), ``write``, ``chmod`` (mode or owner), ``remove``,
    ``rename`` (moved away); ``end``: the last one, ``reason`` says why. (``sync``: a flush's
    marker between a node and its gateway, never yielded to a consumer.)"""
    path: str = ""
    """Relative to the workspace."""
    name: str = ""
    """Relative to the watched folder."""
    is_dir: bool = False
    entry: Entry | None = None
    """The path as it is when the event is read (absent when it no longer exists)."""
    reason: str | None = None


class DirWatch:
    """A folder watched: iterate it for its events (see the module's docstring)."""

    def __init__(self, path: str, recursive: bool, *, watch_id: str | None = None,
                 limit: int = WATCH_QUEUE) -> None:
        self.id = watch_id or f"watch-{uuid.uuid4().hex}"
        self.path = path
        """The watched folder, relative to the workspace (``""``: all of it)."""
        self.recursive = recursive
        self.limit = limit
        self.markers = False
        """Yield ``sync`` markers too (a node passing them on to its gateway)."""
        self.on_end: list[Callable[[DirWatch], object]] = []
        self._queue: asyncio.Queue[WatchEvent] = asyncio.Queue()
        self._ended: str | None = None
        self._yielded_end = False
        self._syncs = 0
        self._synced = asyncio.Event()

    def __repr__(self) -> str:
        state = f"ended: {self._ended}" if self._ended else f"{self._queue.qsize()} queued"
        return f"<{type(self).__name__} {self.id} {self.path or '.'!r} {state}>"

    @property
    def ended(self) -> str | None:
        """Why it ended, once it did."""
        return self._ended

    def put(self, event: WatchEvent) -> None:
        """An event from the source, in order (ignored once ended)."""
        if self._ended is not None:
            return
        if event.type == "sync":
            self._syncs += 1
            self._synced.set()
            self._synced = asyncio.Event()
            if not self.markers:
                return
        if event.type == "end":
            self.end(event.reason or "the watch ended")
        elif self._queue.qsize() >= self.limit:
            self.end(LAGGED.format(self.limit))
        else:
            self._queue.put_nowait(event)

    def end(self, reason: str) -> None:
        """End it: the consumer gets what is queued, then an ``end`` event with ``reason``."""
        if self._ended is not None:
            return
        self._ended = reason
        self._queue.put_nowait(WatchEvent(type="end", reason=reason))
        self._synced.set()
        for listener in self.on_end:
            listener(self)
        self._stop()

    def __aiter__(self) -> DirWatch:
        return self

    async def __anext__(self) -> WatchEvent:
        while not self._yielded_end:
            event = await self._queue.get()
            if event.type == "sync" and not self.markers:
                continue
            self._yielded_end = event.type == "end"
            return event
        raise StopAsyncIteration

    def take(self) -> list[WatchEvent]:
        """The events queued now (a poller's answer), the ``end`` one last if it ended."""
        taken: list[WatchEvent] = []
        while not self._queue.empty():
            event = self._queue.get_nowait()
            if event.type != "sync":
                taken.append(event)
        self._yielded_end = self._yielded_end or any(e.type == "end" for e in taken)
        return taken

    async def flush(self, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        """Wait until every change made before the call is queued (at most ``timeout_s``)."""
        if self._ended is not None:
            return
        target = self._syncs + 1
        await self.ask_sync()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self._syncs < target and self._ended is None:
                    await self._synced.wait()

    async def close(self, reason: str = "the watch was stopped") -> None:
        """Stop watching; the consumer still gets what was queued, then the ``end`` event."""
        self.end(reason)
        await self._release()

    # -- the source: subclasses ---------------------------------------------------------------

    async def ask_sync(self) -> None:
        """Ask the source for a ``sync`` marker after what it has seen so far."""

    def _stop(self) -> None:
        """Stop the source now (no I/O awaited: :meth:`_release` finishes it)."""

    async def _release(self) -> None:
        """Wait until the source is stopped and released."""


class SandboxWatch(DirWatch):
    """A watch served by the watcher program in the session's sandbox."""

    def __init__(self, path: str, recursive: bool, process: CommandProcess, **kwargs: Any
                 ) -> None:
        super().__init__(path, recursive, **kwargs)
        self._process = process
        self._buffer = bytearray()
        self._pump: asyncio.Task[None] | None = None
        self._released: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Wait until the watcher's watches are in place; :class:`FileMissing` or
        :class:`WorkspaceError` when the folder cannot be watched."""
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                first = await self._line()
        except TimeoutError:
            first = None
        if first is None and self._ended is not None:
            return  # ended while it started (the session paused or went): said by its end
        if first is None or first.get("type") != "ready":
            await self._release_now()
            if first is not None and first.get("kind") == "missing":
                raise FileMissing(self.path)
            if first is not None and first.get("kind") == "not_dir":
                raise WorkspaceError(f"{self.path!r} is not a folder")
            raise BackendError(f"the sandbox's folder watcher did not start: {first!r}")
        self._pump = asyncio.create_task(self._read(), name=f"replgate-{self.id}")

    async def _line(self) -> dict[str, Any] | None:
        """The watcher's next line, parsed; None at its end."""
        while b"\n" not in self._buffer:
            piece = await self._process.read()
            if piece is None:
                return None
            stream, data = piece
            if stream == "stdout":
                self._buffer += data
            else:
                logger.warning("%s: the folder watcher said %r", self.id, data[:500])
        line, _, rest = self._buffer.partition(b"\n")
        self._buffer = bytearray(rest)
        try:
            parsed: dict[str, Any] = json.loads(line)
        except ValueError:
            return {"type": "error", "kind": "garbled",
                    "message": line[:200].decode(errors="replace")}
        return parsed

    async def _read(self) -> None:
        try:
            while self._ended is None:
                line = await self._line()
                if line is None:
                    self.end("the folder watcher stopped (its sandbox was replaced or stopped)")
                    return
                self.put(self._event(line))
        except (OSError, BackendError, ValidationError) as exc:
            self.end(f"the folder watcher failed: {exc}")

    def _event(self, line: dict[str, Any]) -> WatchEvent:
        name = str(line.get("name", ""))
        path = f"{self.path}/{name}" if self.path and name else self.path or name
        info = line.get("entry")
        entry = Entry(path=path, **info) if isinstance(info, dict) else None
        return WatchEvent(type=line.get("type", "end"), path=path, name=name,
                          is_dir=bool(line.get("is_dir")), entry=entry,
                          reason=line.get("reason") or line.get("message"))

    async def ask_sync(self) -> None:
        await self._process.send_signal(signal.SIGUSR1)

    def _stop(self) -> None:
        if self._released is None:
            self._released = asyncio.ensure_future(self._release_now())

    async def _release(self) -> None:
        self._stop()
        assert self._released is not None
        await asyncio.shield(self._released)

    async def _release_now(self) -> None:
        if self._pump is not None and self._pump is not asyncio.current_task():
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
        with contextlib.suppress(Exception):
            await self._process.kill()
        with contextlib.suppress(Exception):
            await self._process.close()


async def end_watches(watches: dict[str, DirWatch], reason: str) -> None:
    """End every watch of a session (it pauses or is deleted), each with ``reason``, and wait
    until their watchers are stopped (a memory pause's dump must not meet them)."""
    ending = list(watches.values())
    for watch in ending:
        watch.end(reason)
    for watch in ending:
        with contextlib.suppress(Exception):
            await watch.close(reason)
