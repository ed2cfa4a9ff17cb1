"""The session WebSocket: ``/v1/sessions/{id}/ws``, events streamed as they happen.

One sender task owns the socket's writes; each execution's events reach it through a bounded
queue, so a client that reads slowly slows only its own forwarding (the execution itself runs
on, its capped events kept in the session). A client that disconnects leaves its executions
running; their results stay in the session's history.

Every pause or resume of the session while the socket is open, whoever asked for it, is
streamed as ``transfer`` frames (:class:`gateway.wire.TransferFrame`); one that an execution's
start caused carries that execution's id and comes before its output.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import TypeAdapter, ValidationError

from common.tracing import SOCKET_SEND
from gateway.auth import extract_token, origin_allowed
from gateway.errors import (
    DOMAIN_ERRORS,
    WS_CLOSE_FORBIDDEN_ORIGIN,
    MalformedMessage,
    close_code_for,
    detail_for,
    status_for,
)
from gateway.service import Gateway
from gateway.wire import (
    CommandDone,
    CommandFrame,
    CommandKilledFrame,
    CommandRequest,
    DoneEvent,
    EventFrame,
    Frame,
    InterruptedFrame,
    RejectedFrame,
    StreamEvent,
    TransferFrame,
    WsClientMessage,
    WsCommand,
    WsExecute,
    WsKillCommand,
)
from kernel_pool import ExecutionHandle, SessionPort, Transfer, TransferListener

router = APIRouter()
_MESSAGE = TypeAdapter(WsClientMessage)
SEND_BUFFER = 256


async def accept_authenticated(websocket: WebSocket) -> tuple[Gateway, str] | None:
    """Check origin and key before any event; close with 4403/4401 when refused."""
    gateway: Gateway = websocket.app.state.gateway
    await websocket.accept()
    if not origin_allowed(websocket.headers, gateway.settings.allowed_origins):
        await websocket.close(code=WS_CLOSE_FORBIDDEN_ORIGIN, reason="origin not allowed")
        return None
    token = extract_token(websocket.headers.get("authorization"),
                          websocket.query_params.get("token"))
    try:
        tenant = await gateway.authenticate(token)
    except DOMAIN_ERRORS as exc:
        await websocket.close(code=close_code_for(exc), reason="missing or wrong API key")
        return None
    return gateway, tenant


async def accept_session(websocket: WebSocket,
                         session_id: str) -> tuple[Gateway, str, SessionPort] | None:
    """Accept, authenticate, and find the tenant's session (closing with 4404 when absent)."""
    accepted = await accept_authenticated(websocket)
    if accepted is None:
        return None
    gateway, tenant = accepted
    try:
        session = await gateway.session(tenant, session_id)
    except DOMAIN_ERRORS as exc:
        await websocket.close(code=close_code_for(exc), reason="session not found")
        return None
    return gateway, tenant, session


@router.websocket("/v1/sessions/{session_id}/ws")
async def session_socket(websocket: WebSocket, session_id: str) -> None:
    found = await accept_session(websocket, session_id)
    if found is None:
        return
    gateway, tenant, session = found
    outbox: asyncio.Queue[Frame] = asyncio.Queue(SEND_BUFFER)
    forwarders: set[asyncio.Task[None]] = set()
    sender = asyncio.create_task(_send_all(websocket, outbox))
    transfers = _transfers_into(outbox, forwarders)
    session.transfer_listeners.append(transfers)
    try:
        while True:
            raw = await websocket.receive_text()
            reply = await _handle(raw, gateway, tenant, session, outbox, forwarders)
            if reply is not None:
                await outbox.put(reply)
    except WebSocketDisconnect:
        pass
    finally:
        with contextlib.suppress(ValueError):
            session.transfer_listeners.remove(transfers)
        for task in (*forwarders, sender):
            task.cancel()
        for task in (*forwarders, sender):
            with contextlib.suppress(BaseException):
                await task


async def _handle(raw: str, gateway: Gateway, tenant: str, session: SessionPort,
                  outbox: asyncio.Queue[Frame], forwarders: set[asyncio.Task[None]]
                  ) -> Frame | None:
    try:
        message = _MESSAGE.validate_python(json.loads(raw))
    except (ValueError, ValidationError) as exc:
        detail = exc.errors(include_url=False) if isinstance(exc, ValidationError) else str(exc)
        return _rejected(None, MalformedMessage(json.loads(json.dumps(detail, default=str))))
    if isinstance(message, WsKillCommand):
        return CommandKilledFrame(execution_id=message.id, command_id=message.id,
                                  killed=await gateway.kill_command(session, message.id))
    if isinstance(message, WsCommand):
        _start_command(message, gateway, tenant, session, outbox, forwarders)
        return None
    if not isinstance(message, WsExecute):
        return InterruptedFrame(interrupted=await session.interrupt())
    try:
        await gateway.check_new_execution_id(message.id)
        handle = gateway.submit(tenant, session, message.code, message.timeout_s, message.id,
                                trace_context=_trace_context(message),
                                language=message.language, context_id=message.context_id)
    except DOMAIN_ERRORS as exc:
        return _rejected(message.id, exc)
    task = asyncio.create_task(_forward(gateway, handle, outbox))
    forwarders.add(task)
    task.add_done_callback(forwarders.discard)
    return None


def transfer_frame(transfer: Transfer) -> TransferFrame:
    """A session's transfer as the sockets send it."""
    return TransferFrame.model_validate(transfer.model_dump())


def _transfers_into(outbox: asyncio.Queue[Frame],
                    forwarders: set[asyncio.Task[None]]) -> TransferListener:
    """A transfer listener queueing frames for this socket, never blocking the session: a
    client too far behind misses progress frames, but a transfer's end waits for room."""
    def told(_session: SessionPort, transfer: Transfer) -> None:
        frame = transfer_frame(transfer)
        try:
            outbox.put_nowait(frame)
        except asyncio.QueueFull:
            if transfer.state != "running":
                task = asyncio.create_task(outbox.put(frame))
                forwarders.add(task)
                task.add_done_callback(forwarders.discard)
    return told


def _trace_context(message: WsExecute) -> dict[str, str] | None:
    """The W3C trace context the message names, if any (one socket, many traces)."""
    if message.traceparent is None:
        return None
    carrier = {"traceparent": message.traceparent}
    if message.tracestate is not None:
        carrier["tracestate"] = message.tracestate
    return carrier


def _rejected(execution_id: str | None, exc: BaseException) -> RejectedFrame:
    return RejectedFrame(execution_id=execution_id, status_code=status_for(exc),
                         detail=detail_for(exc))


def _start_command(message: WsCommand, gateway: Gateway, tenant: str, session: SessionPort,
                   outbox: asyncio.Queue[Frame], forwarders: set[asyncio.Task[None]]) -> None:
    """Run a shell command whose events the socket streams (a refusal as a rejected frame).
    A socket that closes stops its commands: nobody would read their output."""
    request = CommandRequest(**message.model_dump(exclude={"type"}))
    command_id = request.id = request.id or f"cmd-{uuid.uuid4().hex}"
    # The limiter caps what a command emits, so this queue stays small without a bound.
    frames: asyncio.Queue[Frame | None] = asyncio.Queue()

    def emit(event: StreamEvent) -> None:
        frames.put_nowait(CommandFrame(command_id=command_id, event=event))

    async def run() -> None:
        try:
            result = await gateway.run_command(tenant, session, request, emit)
        except DOMAIN_ERRORS as exc:
            frames.put_nowait(_rejected(command_id, exc))
        else:
            frames.put_nowait(CommandFrame(command_id=command_id, event=CommandDone(
                status=result.status, exit_code=result.exit_code, truncated=result.truncated,
                duration_ms=result.duration_ms, reason=result.reason)))
        finally:
            frames.put_nowait(None)

    async def forward() -> None:
        runner = asyncio.create_task(run())
        try:
            while (frame := await frames.get()) is not None:
                await outbox.put(frame)
        finally:
            if not runner.done():
                try:
                    await gateway.kill_command(session, command_id)
                except DOMAIN_ERRORS:  # its node did not answer: closing its stream stops it
                    runner.cancel()
            await asyncio.shield(runner)

    task = asyncio.create_task(forward())
    forwarders.add(task)
    task.add_done_callback(forwarders.discard)


async def _forward(gateway: Gateway, handle: ExecutionHandle,
                   outbox: asyncio.Queue[Frame]) -> None:
    async for event in handle.stream():
        if isinstance(event, DoneEvent):
            # "done" only once the execution is in the history, so a reconnecting client
            # that was told it finished always finds it there.
            await gateway.recorded(handle)
        await outbox.put(EventFrame(execution_id=handle.id, event=event))


async def _send_all(websocket: WebSocket, outbox: asyncio.Queue[Frame]) -> None:
    send = websocket.scope.get(SOCKET_SEND)  # traced: past the instrumentation's wrapper
    while True:
        frame = await outbox.get()
        if send is None:
            await websocket.send_text(frame.text())
        else:
            await send({"type": "websocket.send", "text": frame.text()})
