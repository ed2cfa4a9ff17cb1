"""The answer of E2B's ``/execute``: an execution's events as JSON lines, written as they
happen (:mod:`gateway.e2b._results` says what each line is).

The SDKs enforce their ``timeout`` on the client side by dropping the connection; the cell is
then stopped (an interrupt: variables are kept) so the next ``run_code`` does not wait behind
it. A sandbox killed (deleted) while its code runs cuts the stream without its last chunk, as
the connection to E2B's vanished sandbox breaks: the SDKs then ask whether the sandbox still
runs and raise their ``TimeoutException`` ("the sandbox was killed while the request was in
progress"). A kernel that dies in a sandbox that lives on ends the stream as usual, its
``DeadKernelError`` said.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.e2b._results import END, KEEPALIVE, Translator
from kernel_pool import (
    DisplayEvent,
    DoneEvent,
    Event,
    ExecutionHandle,
    ExecutionStatus,
    SessionPort,
)

logger = logging.getLogger(__name__)

KEEPALIVE_S = 2.0
"""A line at least this often: a client that vanished without closing is noticed by the
write that fails, and its cell stopped."""
HEADERS_S = 0.05
"""How long the headers may wait for the first lines to share their write (a client counts
its request timeout until the headers come)."""
HOLD_S = 0.005
"""How long a cell's main result (its last expression's value) may wait for the end of the
execution, which the kernel sends right after it, to share its write."""
CLOSED_REASON = "the session was closed"
"""The reason of an execution ended by its session's deletion (a session on another node
says so before this gateway's copy of it is marked closed)."""


class ExecutionStream(Response):
    """The ``/execute`` answer: one JSON line per event, written as they happen."""

    media_type = "application/x-ndjson"

    def __init__(self, session: SessionPort, handle: ExecutionHandle) -> None:
        # Not Response.__init__: it would declare a Content-Length of the (empty) body.
        self.status_code = 200
        self.background = None
        self.raw_headers = [(b"content-type", self.media_type.encode())]
        self.session = session
        self.handle = handle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pump = asyncio.create_task(self._pump(send))
        gone = asyncio.create_task(_disconnected(receive))
        try:
            await asyncio.wait({pump, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            pump.cancel()
            await self._stop_if_unfinished()
            for task in (pump, gone):
                with contextlib.suppress(asyncio.CancelledError, OSError):
                    await task

    async def _pump(self, send: Send) -> None:
        # Each write to the socket costs the gateway and the client a wake-up, so the headers
        # wait (at most HEADERS_S) for the first lines, and a cell's main result waits (at
        # most HOLD_S) for the end that follows it: `1+1` is answered in one go. (Declaring a
        # Content-Length when that is the whole answer measured slower.)
        translator = Translator(self.handle.language)
        events = _Events(self.handle)
        started = False
        held: list[dict[str, Any]] = []
        try:
            while True:
                patience = HOLD_S if held else KEEPALIVE_S if started else HEADERS_S
                event = await events.next(within=patience)
                # A sandbox killed meanwhile: what came before is said, the end is not, and
                # returning with the body unfinished makes the ASGI server cut the connection.
                cut = self._killed(event)
                if event is None:  # nothing came in time: what was held, or a keepalive
                    lines, held = held or ([KEEPALIVE] if started else []), []
                elif cut:
                    lines, held = held, []
                    logger.info("sandbox %s was deleted during execution %s: its E2B stream "
                                "is cut (the ASGI server says it was not completed)",
                                self.session.id, self.handle.id)
                else:
                    lines, held = held + translator.lines(event), []
                    if _is_main_result(event):
                        held = lines
                        continue
                last = isinstance(event, DoneEvent)
                if last and not cut:
                    lines.append(END)
                if not started:
                    started = True
                    await send({"type": "http.response.start", "status": 200,
                                "headers": self.raw_headers})
                if lines:
                    body = "".join(json.dumps(line) + "\n" for line in lines).encode()
                    await send({"type": "http.response.body", "body": body,
                                "more_body": not last or cut})
                if last:
                    return
        finally:
            events.close()

    def _killed(self, done: Event | None) -> bool:
        """Whether the execution ended because its sandbox was deleted."""
        return (isinstance(done, DoneEvent) and done.status is ExecutionStatus.DIED
                and (self.session.closed or done.reason == CLOSED_REASON))

    async def _stop_if_unfinished(self) -> None:
        """The client left (its timeout, or it was stopped): stop this cell, keep the state."""
        handle = self.handle
        if handle.done is not None:
            return
        if handle.run is None:
            handle.withdrawn = "withdrawn: the E2B client stopped waiting before it ran"
        elif self.session.current is handle:
            logger.info("E2B client of session %s left during execution %s; interrupting it",
                        self.session.id, handle.id)
            await self.session.interrupt()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class _Events:
    """An execution's events, each awaited for a while without ending the stream when none
    comes in time (the wait is a task of its own, which a timeout leaves running)."""

    def __init__(self, handle: ExecutionHandle) -> None:
        self._handle = handle
        self._iterator = aiter(handle.stream())
        self._pending: asyncio.Future[Event] | None = None

    async def next(self, within: float) -> Event | None:
        """The next event, or None if none came ``within`` seconds."""
        if self._pending is None:
            self._pending = asyncio.ensure_future(anext(self._iterator))
        done, _ = await asyncio.wait({self._pending}, timeout=within)
        if not done:
            return None
        pending, self._pending = self._pending, None
        try:
            return pending.result()
        except StopAsyncIteration:
            raise RuntimeError(f"execution {self._handle.id} ended without its done "
                               "event") from None

    def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()


def _is_main_result(event: Event) -> bool:
    return isinstance(event, DisplayEvent) and event.type == "result"
