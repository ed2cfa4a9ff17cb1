"""One channels WebSocket of Jupyter's kernel API (``/api/kernels/{id}/channels``).

``execute_request`` runs through the gateway's engine (limits, real timeouts, output caps,
history, audit, notebook export) and its outcome is told back as Jupyter messages; the other
shell and control requests go to the kernel through :meth:`kernel_pool.SessionPort.relay` and its
replies are rebuilt from their parsed content (:mod:`gateway.jupyter.protocol`). stdin is not
offered: ``input()`` fails fast. A kernel of another language than Python runs its executions
in that language's context; its ``kernel_info_request`` is answered here (the relay reaches
the session's Python kernel only) and its other requests are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import WebSocket

from gateway.errors import DOMAIN_ERRORS, InvalidInput
from gateway.jupyter._languages import (
    LANGUAGE_SPECS,
    interrupt_kernel,
    restart_kernel,
)
from gateway.jupyter.protocol import (
    Message,
    ProtocolError,
    abnormal_error,
    decode,
    encode,
    execute_reply,
    from_kernel,
    new_message,
    output_message,
)
from gateway.service import Gateway
from gateway.wire import (
    ApprovalEvent,
    DisplayEvent,
    DoneEvent,
    ErrorEvent,
    ExecutionStatus,
    PendingApprovalEvent,
    StreamEvent,
)
from kernel_pool import SessionPort

__all__ = ["KernelChannels"]

logger = logging.getLogger(__name__)

SEND_BUFFER = 256
MAX_QUEUED_EXECUTES = 128
MAX_QUEUED_CODE_BYTES = 16 * 1024 * 1024
MAX_RELAYS = 32
RELAYED = frozenset({"kernel_info_request", "complete_request", "inspect_request",
                     "is_complete_request", "comm_info_request", "history_request"})


class KernelChannels:
    """One channels WebSocket: a receiver, an executor running execute_requests in order,
    relays for other requests, and one sender owning the socket's writes (bounded queue)."""

    def __init__(self, websocket: WebSocket, gateway: Gateway, tenant: str, session: SessionPort,
                 binary: bool, language: str = "python") -> None:
        self.websocket = websocket
        self.language = language
        """The language its executions run in (its kernelspec's)."""
        self.gateway = gateway
        self.tenant = tenant
        self.session = session
        self.binary = binary
        self.key = uuid.uuid4().hex
        """``session`` of the gateway's messages on this connection."""
        self._outbox: asyncio.Queue[tuple[str | bytes, Callable[[], None] | None]] = (
            asyncio.Queue(SEND_BUFFER))
        self._executes: asyncio.Queue[tuple[Message, int, int]] = asyncio.Queue(
            MAX_QUEUED_EXECUTES)
        self._queued_bytes = 0
        self._received = 0
        """execute_requests queued so far; each queued one holds its number."""
        self._running = 0
        """The number of the execute_request running (or last run)."""
        self._received_before_error: int | None = None
        """How many had been queued when the running cell's first error was written to the
        socket (None until then)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = asyncio.Event()

    def _on_closed(self, session: SessionPort, reason: str) -> None:
        if session.id == self.session.id:
            self._closed.set()

    async def serve(self) -> None:
        pool = self.gateway.pool
        pool.on_session_closed.append(self._on_closed)
        main = [asyncio.create_task(coro) for coro in (
            self._send_all(), self._receive_all(), self._run_executes(), self._closed.wait())]
        try:
            await asyncio.wait(main, return_when=asyncio.FIRST_COMPLETED)
            if self._closed.is_set() and not main[0].done():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(2):  # a client that does not read gets no more
                        await self._status({}, "dead")
                        await self._outbox.join()
                with contextlib.suppress(RuntimeError):
                    await self.websocket.close(code=1000, reason="kernel deleted")
        finally:
            with contextlib.suppress(ValueError):
                pool.on_session_closed.remove(self._on_closed)
            tasks = [*main, *self._tasks]
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(BaseException):
                    await task

    # -- sending -----------------------------------------------------------------------------

    async def _send_all(self) -> None:
        while True:
            frame, on_written = await self._outbox.get()
            try:
                if isinstance(frame, bytes):
                    await self.websocket.send_bytes(frame)
                else:
                    await self.websocket.send_text(frame)
                if on_written is not None:
                    on_written()
            finally:
                self._outbox.task_done()

    async def _emit(self, message: Message, on_written: Callable[[], None] | None = None) -> None:
        await self._outbox.put((encode(message, self.binary), on_written))

    async def _emit_error(self, error: ErrorEvent, parent: dict[str, Any], count: int,
                          running: bool = True) -> None:
        """An ``error`` message; the running cell's has its writing noted: what a client sends
        after it may be a reaction to it, and is not aborted (see :meth:`_run_executes`)."""
        await self._emit(output_message(error, parent=parent, session=self.key,
                                        execution_count=count),
                         functools.partial(self._error_written, self._running) if running
                         else None)

    def _error_written(self, number: int) -> None:
        # a cell's error written after the next cell started (a client slow to read) is no
        # longer what that next cell's aborts are measured from
        if number == self._running and self._received_before_error is None:
            self._received_before_error = self._received

    async def _send(self, request: Message | dict[str, Any], channel: str, msg_type: str,
                    content: dict[str, Any]) -> None:
        parent = request.header if isinstance(request, Message) else request
        await self._emit(new_message(msg_type, content, channel=channel, parent=parent,
                                     session=self.key))

    async def _status(self, request: Message | dict[str, Any], state: str) -> None:
        await self._send(request, "iopub", "status", {"execution_state": state})

    async def _reply(self, request: Message, msg_type: str, content: dict[str, Any]) -> None:
        await self._send(request, request.channel, msg_type, content)

    # -- receiving ---------------------------------------------------------------------------

    async def _receive_all(self) -> None:
        while True:
            event = await self.websocket.receive()
            if event["type"] == "websocket.disconnect":
                return
            frame = event.get("bytes")
            frame = event.get("text") if frame is None else frame
            if frame is None:
                continue
            try:
                request = decode(frame, self.binary)
            except ProtocolError as exc:
                logger.info("kernel %s: dropped a malformed client message: %s",
                            self.session.id, exc)
                continue
            await self._dispatch(request)

    async def _dispatch(self, request: Message) -> None:
        kind = request.msg_type
        if request.channel not in ("shell", "control"):
            return  # stdin is not offered; iopub is not for clients to send on
        if kind == "execute_request":
            await self._enqueue(request)
        elif kind == "interrupt_request":
            await interrupt_kernel(self.gateway, self.tenant, self.session)
            await self._reply(request, "interrupt_reply", {"status": "ok"})
        elif kind == "shutdown_request":
            self._spawn(self._shutdown(request))
        elif kind in RELAYED and self.language != "python":
            await self._answer_here(request)
        elif kind in RELAYED:
            if len(self._tasks) >= MAX_RELAYS:
                await self._reply(request, kind.removesuffix("_request") + "_reply", {
                    "status": "error", "ename": "TooManyRequests", "traceback": [],
                    "evalue": f"over {MAX_RELAYS} requests in flight on this connection"})
            else:
                self._spawn(self._relay(request))
        else:
            logger.debug("kernel %s: ignored %s on %s", self.session.id, kind, request.channel)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _shutdown(self, request: Message) -> None:
        """``restart: true`` restarts the kernel; a plain shutdown leaves the session to
        ``DELETE /api/kernels/{id}`` (what jupyter_server sends) or the idle cull."""
        restart = request.content.get("restart") is True
        if restart:
            await restart_kernel(self.gateway, self.tenant, self.session)
        await self._reply(request, "shutdown_reply", {"status": "ok", "restart": restart})

    # -- requests to a kernel of another language -------------------------------------------

    async def _answer_here(self, request: Message) -> None:
        """``kernel_info`` from the language's spec (what nbclient needs); the others are
        refused, the kernel being out of the relay's reach."""
        kind = request.msg_type
        await self._status(request, "busy")
        if kind == "kernel_info_request":
            spec = LANGUAGE_SPECS[self.language]
            await self._reply(request, "kernel_info_reply", {
                "status": "ok", "protocol_version": "5.3", "implementation": spec.name,
                "implementation_version": "", "language_info": spec.language_info,
                "banner": f"{spec.display_name}, a code context of a replgate session",
                "help_links": [], "debugger": False})
        else:
            await self._reply(request, kind.removesuffix("_request") + "_reply", {
                "status": "error", "ename": "NotOffered", "traceback": [],
                "evalue": f"{kind} is answered by Python kernels only here"})
        await self._status(request, "idle")

    # -- relayed requests --------------------------------------------------------------------

    async def _relay(self, request: Message) -> None:
        """Send the request to the kernel; re-emit its reply and its busy/idle status."""
        kind = request.msg_type
        reply_type = kind.removesuffix("_request") + "_reply"
        # kernel_info on control is answered even while code runs (as jupyter_server does)
        channel = "control" if kind == "kernel_info_request" else request.channel
        try:
            async for source, msg in self.session.relay(kind, request.content, channel=channel):
                if source != "iopub":
                    reply = from_kernel(msg, channel=request.channel, parent=request.header,
                                        session=self.key)
                    if reply.msg_type == "kernel_info_reply":
                        reply.content["debugger"] = False  # debug_request is not relayed
                    await self._emit(reply)
                elif msg.get("msg_type") == "status":
                    content = msg.get("content")
                    state = content.get("execution_state") if isinstance(content, dict) else None
                    if state in ("busy", "idle"):
                        await self._status(request, state)
        except DOMAIN_ERRORS as exc:
            await self._reply(request, reply_type, {"status": "error", "ename": "KernelUnavailable",
                                                    "evalue": str(exc), "traceback": []})

    # -- executions --------------------------------------------------------------------------

    async def _enqueue(self, request: Message) -> None:
        code = request.content.get("code")
        size = len(code.encode("utf-8", "surrogatepass")) if isinstance(code, str) else 0
        if self._queued_bytes + size > MAX_QUEUED_CODE_BYTES or self._executes.full():
            await self._status(request, "busy")
            await self._fail(request, "TooManyRequests",
                             "too many executions queued on this connection; wait for some",
                             running=False)
            return
        self._received += 1
        self._queued_bytes += size
        self._executes.put_nowait((request, size, self._received))

    def _dequeue(self, item: tuple[Message, int, int]) -> Message:
        self._queued_bytes -= item[1]
        return item[0]

    async def _run_executes(self) -> None:
        """One execute_request at a time, in order. After a failed one that asked
        ``stop_on_error`` (the default), those queued before its error was written to the
        socket are aborted: they were sent before the client could know of it. ipykernel aborts
        what reached its queue by the time it sent the cell's execute_reply, so a cell sent on
        seeing the ``error`` message mostly runs there (AutoGen's Jupyter executor sends its
        next cell so); here the error travels through the engine and the history's record
        before the reply, a window in which such a cell nearly always arrived."""
        while True:
            item = await self._executes.get()
            request, number = self._dequeue(item), item[2]
            self._running, self._received_before_error = number, None
            ok = await self._execute(request)
            if ok or request.content.get("stop_on_error", True) is False:
                continue
            # an error not yet written (a client slow to read): all queued came before it
            before = (self._received if self._received_before_error is None
                      else self._received_before_error)
            # numbers are consecutive and in queue order: those up to `before` are its head
            for _ in range(before - number):
                aborted = self._dequeue(self._executes.get_nowait())
                await self._status(aborted, "busy")
                await self._reply(aborted, "execute_reply", {"status": "aborted"})
                await self._status(aborted, "idle")

    async def _fail(self, request: Message, ename: str, evalue: str,
                    running: bool = True) -> None:
        error = ErrorEvent(ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])
        count = self.session.state().execution_count
        await self._emit_error(error, request.header, count, running)
        await self._reply(request, "execute_reply", {
            "status": "error", "execution_count": count, "ename": ename, "evalue": evalue,
            "traceback": error.traceback})
        await self._status(request, "idle")

    async def _next_count(self) -> int:
        """The kernel's count for the execution just submitted (its done event says it for
        sure)."""
        if self.language == "python":
            state = self.session.state()
            return state.execution_count + state.pending
        contexts = await self.session.list_contexts()
        return next((c.execution_count for c in contexts if c.id == self.language), 0) + 1

    async def _execute(self, request: Message) -> bool:
        """Run one execute_request through the engine; True when it ended ``ok``."""
        code, silent = request.content.get("code"), request.content.get("silent") is True
        parent = request.header
        await self._status(request, "busy")
        try:
            if not isinstance(code, str):
                raise InvalidInput("execute_request content.code must be a string")
            handle = self.gateway.submit(
                self.tenant, self.session, code, None,
                language=None if self.language == "python" else self.language)
        except DOMAIN_ERRORS as exc:
            await self._fail(request, type(exc).__name__, str(exc))
            return False
        count = await self._next_count()
        if not silent:
            await self._send(request, "iopub", "execute_input",
                             {"code": code, "execution_count": count})
        error: ErrorEvent | None = None
        done: DoneEvent | None = None
        async for event in handle.stream():
            if isinstance(event, DoneEvent):
                done = event
                break
            if isinstance(event, ErrorEvent):
                error = event
                await self._emit_error(event, parent, count)
                continue
            if silent and isinstance(event, DisplayEvent) and event.type == "result":
                continue
            if isinstance(event, PendingApprovalEvent | ApprovalEvent):  # governance: say so
                event = StreamEvent(type="stderr", text=(
                    f"[replgate] held for approval {event.approval_id} until {event.expires_at}"
                    f" ({', '.join(event.rules)})\n" if isinstance(event, PendingApprovalEvent)
                    else f"[replgate] approval {event.approval_id}: {event.decision}\n"))
            await self._emit(output_message(event, parent=parent, session=self.key,
                                            execution_count=count))
        assert done is not None
        try:
            await self.gateway.recorded(handle)  # in the history before the client hears "done"
        except Exception:
            logger.exception("recording execution %s failed", handle.id)
        if done.execution_count is not None:
            count = done.execution_count
        if done.status != ExecutionStatus.OK:
            if error is None:
                error = abnormal_error(done)
                await self._emit_error(error, parent, count)
            elif done.reason and (done.status != ExecutionStatus.INTERRUPTED or done.restarted):
                await self._send(request, "iopub", "stream",
                                 {"name": "stderr", "text": f"[replgate] {done.reason}\n"})
        await self._reply(request, "execute_reply", execute_reply(done, error, count))
        await self._status(request, "idle")
        return done.status == ExecutionStatus.OK
