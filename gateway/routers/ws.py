"""The session WebSocket: ``/v1/sessions/{id}/ws``, events streamed as they happen.

One sender task owns the socket's writes; each execution's events reach it through a bounded
queue, so a client that reads slowly slows only its own forwarding (the execution itself runs
on, its capped events kept in the session). A client that disconnects leaves its executions
running; their results stay in the session's history.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import TypeAdapter, ValidationError

from gateway.auth import extract_token
from gateway.errors import (
    WS_CLOSE_FORBIDDEN_ORIGIN,
    WS_CLOSE_NOT_FOUND,
    WS_CLOSE_UNAUTHORIZED,
    GatewayError,
    status_for,
)
from gateway.models import (
    CommandRequest,
    WsClientMessage,
    WsCommand,
    WsExecute,
    WsKillCommand,
)
from gateway.service import Gateway, event_frame
from kernel_pool.events import CommandDone, DoneEvent, StreamEvent
from kernel_pool.exceptions import KernelPoolError
from kernel_pool.session import ExecutionHandle, Session

router = APIRouter()
_MESSAGE = TypeAdapter(WsClientMessage)
SEND_BUFFER = 256


def origin_allowed(websocket: WebSocket, allowed: list[str]) -> bool:
    """Browsers send Origin; it must be the gateway's own or one configured."""
    origin = websocket.headers.get("origin")
    if origin is None:
        return True
    host = websocket.headers.get("host", "")
    return urlsplit(origin).netloc == host or origin in allowed


async def accept_authenticated(websocket: WebSocket) -> tuple[Gateway, str] | None:
    """Check origin and key before any event; close with 4403/4401 when refused."""
    gateway: Gateway = websocket.app.state.gateway
    await websocket.accept()
    if not origin_allowed(websocket, gateway.settings.allowed_origins):
        await websocket.close(code=WS_CLOSE_FORBIDDEN_ORIGIN, reason="origin not allowed")
        return None
    token = extract_token(websocket.headers.get("authorization"),
                          websocket.query_params.get("token"))
    try:
        tenant = await gateway.authenticate(token)
    except GatewayError:
        await websocket.close(code=WS_CLOSE_UNAUTHORIZED, reason="missing or wrong API key")
        return None
    return gateway, tenant


async def accept_session(websocket: WebSocket,
                         session_id: str) -> tuple[Gateway, str, Session] | None:
    """Accept, authenticate, and find the tenant's session (closing with 4404 when absent)."""
    accepted = await accept_authenticated(websocket)
    if accepted is None:
        return None
    gateway, tenant = accepted
    try:
        session = gateway.session(tenant, session_id)
    except KernelPoolError:
        await websocket.close(code=WS_CLOSE_NOT_FOUND, reason="session not found")
        return None
    return gateway, tenant, session


@router.websocket("/v1/sessions/{session_id}/ws")
async def session_socket(websocket: WebSocket, session_id: str) -> None:
    found = await accept_session(websocket, session_id)
    if found is None:
        return
    gateway, tenant, session = found
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue(SEND_BUFFER)
    forwarders: set[asyncio.Task[None]] = set()
    sender = asyncio.create_task(_send_all(websocket, outbox))
    try:
        while True:
            raw = await websocket.receive_text()
            reply = await _handle(raw, gateway, tenant, session, outbox, forwarders)
            if reply is not None:
                await outbox.put(reply)
    except WebSocketDisconnect:
        pass
    finally:
        for task in (*forwarders, sender):
            task.cancel()
        for task in (*forwarders, sender):
            with contextlib.suppress(BaseException):
                await task


async def _handle(raw: str, gateway: Gateway, tenant: str, session: Session,
            outbox: asyncio.Queue[dict[str, Any]],
            forwarders: set[asyncio.Task[None]]) -> dict[str, Any] | None:
    try:
        message = _MESSAGE.validate_python(json.loads(raw))
    except (ValueError, ValidationError) as exc:
        detail = exc.errors(include_url=False) if isinstance(exc, ValidationError) else str(exc)
        return {"type": "rejected", "execution_id": None, "status_code": 422,
                "detail": json.loads(json.dumps(detail, default=str))}
    if isinstance(message, WsKillCommand):
        return {"type": "command_killed", "execution_id": message.id, "command_id": message.id,
                "killed": gateway.kill_command(tenant, session.id, message.id)}
    if isinstance(message, WsCommand):
        return _start_command(message, gateway, tenant, session, outbox, forwarders)
    if not isinstance(message, WsExecute):
        return {"type": "interrupted", "execution_id": None, "interrupted": session.interrupt()}
    try:
        await gateway.check_new_execution_id(message.id)
        handle = gateway.submit(tenant, session, message.code, message.timeout_s, message.id)
    except (GatewayError, KernelPoolError) as exc:
        return {"type": "rejected", "execution_id": message.id, "status_code": status_for(exc),
                "detail": str(exc)}
    task = asyncio.create_task(_forward(gateway, handle, outbox))
    forwarders.add(task)
    task.add_done_callback(forwarders.discard)
    return None


def _start_command(message: WsCommand, gateway: Gateway, tenant: str, session: Session,
                   outbox: asyncio.Queue[dict[str, Any]],
                   forwarders: set[asyncio.Task[None]]) -> dict[str, Any] | None:
    """Start a shell command whose events the socket streams; a refusal answers at once."""
    request = CommandRequest(**message.model_dump(exclude={"type"}))
    if request.id is None:
        request.id = f"cmd-{uuid.uuid4().hex}"
    command_id = request.id
    # The limiter caps what a command emits, so this queue stays small without a bound.
    events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    def emit(event: StreamEvent) -> None:
        events.put_nowait({**event.model_dump(mode="json"), "execution_id": command_id,
                           "command_id": command_id})

    async def run() -> None:
        try:
            result = await gateway.run_command(tenant, session, request, emit)
        except (GatewayError, KernelPoolError) as exc:
            events.put_nowait({"type": "rejected", "execution_id": command_id,
                               "command_id": command_id, "status_code": status_for(exc),
                               "detail": str(exc)})
        else:
            done = CommandDone(status=result.status, exit_code=result.exit_code,
                               truncated=result.truncated, duration_ms=result.duration_ms,
                               reason=result.reason)
            events.put_nowait({**done.model_dump(mode="json"), "execution_id": command_id,
                               "command_id": command_id})
        finally:
            events.put_nowait(None)

    async def forward() -> None:
        runner = asyncio.create_task(run())
        try:
            while (frame := await events.get()) is not None:
                await outbox.put(frame)
        finally:
            # a socket that closes stops the command: nobody would read its output
            if not runner.done():
                gateway.kill_command(tenant, session.id, command_id)
            await asyncio.shield(runner)

    task = asyncio.create_task(forward())
    forwarders.add(task)
    task.add_done_callback(forwarders.discard)
    return None


async def _forward(gateway: Gateway, handle: ExecutionHandle,
                   outbox: asyncio.Queue[dict[str, Any]]) -> None:
    async for event in handle.stream():
        if isinstance(event, DoneEvent):
            # "done" only once the execution is in the history, so a reconnecting client
            # that was told it finished always finds it there.
            await gateway.recorded(handle)
        await outbox.put(event_frame(handle.id, event))


async def _send_all(websocket: WebSocket, outbox: asyncio.Queue[dict[str, Any]]) -> None:
    while True:
        frame = await outbox.get()
        await websocket.send_text(json.dumps(frame))
