"""The watch WebSocket: ``/v1/sessions/{id}/watch``, a session's history then its executions live.

A watcher sees every execution of the session, whoever runs it (HTTP, WebSocket, MCP, another
browser). It first gets the history: each past execution as an ``{"type": "execution",
"execution_id", "code", "started_at"}`` frame followed by its stored events, then a
``{"type": "history_end"}`` frame, then live frames in the same shapes: an ``execution`` frame
when an execution starts, then its events as the session WebSocket sends them
(:class:`gateway.wire.EventFrame`). A pause or resume of the session comes live as
``transfer`` frames (:class:`gateway.wire.TransferFrame`), for a progress bar. Clients send
nothing (anything sent is ignored).

Each watcher has a bounded queue fed by a :data:`Session.listeners <kernel_pool.Listener>`
callback (and a transfer listener), which never blocks the session. A watcher that falls
:data:`WATCH_BUFFER` events behind gets ``{"type": "lagged"}`` and the socket is closed with
1013 (try again later); it reconnects and gets the history again. When the session is
deleted the socket closes with 4404.

Catching up without gaps or repeats: the listener is attached before the history is read, and
executions whose finished record is not yet stored are replayed from their live handles. Each
queued event carries its position in its execution's event list, so events already sent in
the catch-up are skipped when their live copy comes out of the queue.
"""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from gateway.errors import DOMAIN_ERRORS, WS_CLOSE_LAGGED, close_code_for
from gateway.records.executions import RUNNING
from gateway.routers.ws import accept_session, transfer_frame
from gateway.service import Gateway
from gateway.wire import (
    Event,
    EventFrame,
    ExecutionStartFrame,
    Frame,
    HistoryEndFrame,
    LaggedFrame,
    TransferFrame,
)
from kernel_pool import ExecutionHandle, SessionClosed, SessionPort, Transfer

__all__ = ["WATCH_BUFFER", "WS_CLOSE_LAGGED", "Lagged", "Watcher", "router", "watch"]

router = APIRouter()

WATCH_BUFFER = 1024
"""Events a watcher may fall behind before it is dropped."""
CLOSED_POLL_S = 2.0
"""How often a quiet watcher checks that its session still exists."""

Item = tuple[ExecutionHandle, Event | None, int] | TransferFrame


class Lagged(Exception):
    """The watcher fell more than its queue's size behind and missed events."""


class Watcher:
    """A bounded queue of one session's execution starts and events, as a session listener.

    Attach it with ``session.listeners.append(watcher)`` (and its :meth:`transferred` to
    ``session.transfer_listeners``). The listener calls never block and never raise: when
    the queue is full the watcher is marked lagged and stops queueing, and :meth:`next`
    raises :class:`Lagged`.
    """

    def __init__(self, maxsize: int = WATCH_BUFFER) -> None:
        self._queue: asyncio.Queue[Item] = asyncio.Queue(maxsize)
        self.lagged = False

    def __call__(self, session: SessionPort, handle: ExecutionHandle, event: Event | None) -> None:
        # The position is how many of the execution's events exist with this one included.
        self._put((handle, event, len(handle.events)))

    def transferred(self, session: SessionPort, transfer: Transfer) -> None:
        """A transfer listener: the session's pause or resume, as its frame."""
        self._put(transfer_frame(transfer))

    def _put(self, item: Item) -> None:
        if self.lagged:
            return
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            self.lagged = True

    def __repr__(self) -> str:
        return f"<Watcher queued={self._queue.qsize()} lagged={self.lagged}>"

    async def next(self, timeout_s: float) -> Item | None:
        """The next start (event None) or event; None when nothing came within ``timeout_s``."""
        if self.lagged:
            raise Lagged
        try:
            return await asyncio.wait_for(self._queue.get(), timeout_s)
        except TimeoutError:
            return None


@router.websocket("/v1/sessions/{session_id}/watch")
async def watch_socket(websocket: WebSocket, session_id: str) -> None:
    found = await accept_session(websocket, session_id)
    if found is None:
        return
    gateway, tenant, session = found
    watcher = Watcher()
    session.listeners.append(watcher)
    session.transfer_listeners.append(watcher.transferred)
    # Taken in the same step as attaching the listener: nothing can finish in between.
    live = [h for h in gateway.live_executions(session.id) if h.run is not None or h.events]
    reader = asyncio.create_task(_until_disconnect(websocket))
    sender = asyncio.create_task(watch(websocket, gateway, tenant, session, watcher, live))
    try:
        await asyncio.wait({reader, sender}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        with contextlib.suppress(ValueError):
            session.listeners.remove(watcher)
        with contextlib.suppress(ValueError):
            session.transfer_listeners.remove(watcher.transferred)
        for task in (reader, sender):
            task.cancel()
        for task in (reader, sender):
            with contextlib.suppress(BaseException):
                await task


async def _until_disconnect(websocket: WebSocket) -> None:
    with contextlib.suppress(WebSocketDisconnect):
        while True:
            await websocket.receive_text()


async def watch(websocket: WebSocket, gateway: Gateway, tenant: str, session: SessionPort,
                watcher: Watcher, live: list[ExecutionHandle]) -> None:
    """Send the history, then what ``watcher`` queues, until lagged or the session is gone.

    ``watcher`` must already be attached to ``session`` and ``live`` taken in the same step.
    """
    async def send(frame: Frame) -> None:
        await websocket.send_text(frame.text())

    sent: dict[str, int] = {}
    """Execution id -> how many of its events this watcher has been sent."""
    live_ids = {handle.id for handle in live}
    try:
        records = await gateway.history(tenant, session.id)
    except DOMAIN_ERRORS as exc:
        await websocket.close(code=close_code_for(exc), reason="session not found")
        return
    for record in records:
        if record.id in live_ids or record.status == RUNNING:
            continue  # replayed from its handle below, or started since: it comes live
        await send(ExecutionStartFrame(execution_id=record.id, code=record.code,
                                       started_at=record.started_at))
        for past in record.events:
            await send(EventFrame(execution_id=record.id, event=past))
        sent[record.id] = len(record.events)
    for handle in live:
        events = list(handle.events)
        await send(ExecutionStartFrame(execution_id=handle.id, code=handle.code,
                                       started_at=handle.started_at))
        for past in events:
            await send(EventFrame(execution_id=handle.id, event=past))
        sent[handle.id] = len(events)
    await send(HistoryEndFrame())

    while True:
        try:
            item = await watcher.next(CLOSED_POLL_S)
        except Lagged:
            await send(LaggedFrame(detail=f"this watcher fell over {WATCH_BUFFER} events "
                                   "behind; reconnect to get the history again"))
            await websocket.close(code=WS_CLOSE_LAGGED, reason="watcher lagged")
            return
        if item is None:
            if session.closed:
                await websocket.close(code=close_code_for(SessionClosed(session.id)),
                                      reason="session was deleted")
                return
            continue
        if isinstance(item, TransferFrame):
            await send(item)
            continue
        handle, event, position = item
        if handle.id not in sent:
            await send(ExecutionStartFrame(execution_id=handle.id, code=handle.code,
                                           started_at=handle.started_at))
            sent[handle.id] = 0
        if event is None or position <= sent[handle.id]:
            continue
        for missed in handle.events[sent[handle.id]:position]:
            await send(EventFrame(execution_id=handle.id, event=missed))
        sent[handle.id] = position
