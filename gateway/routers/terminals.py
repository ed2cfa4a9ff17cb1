"""Interactive processes: ``/v1/sessions/{id}/terminal`` (a WebSocket) and a running
command's input, close and resize (``/v1/sessions/{id}/commands/{command_id}/...``).

The socket is authenticated and refused as the session WebSocket is (header or ``?token=``;
close 4401, 4403, 4404). Query: ``cols`` and ``rows`` (80x24), ``cmd`` (an interactive bash),
or ``id`` to attach to a running terminal of the session. A refused start or attach closes the
socket with 4000 + the HTTP status and the reason. A client message that is not one of the
three closes it with 4422; the terminal runs on either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from fastapi import APIRouter, Response, WebSocket, WebSocketDisconnect, status
from fastapi.datastructures import State
from pydantic import TypeAdapter, ValidationError

from gateway.deps import GatewayDep, TenantDep
from gateway.errors import (
    DOMAIN_ERRORS,
    WS_CLOSE_LAGGED,
    InvalidInput,
    MalformedMessage,
    close_code_for,
    detail_for,
)
from gateway.routers.ws import accept_session
from gateway.service import Gateway
from gateway.terminals import DEFAULT_COMMAND, Listener, Terminal, Terminals
from gateway.wire import (
    CommandInput,
    TerminalClientMessage,
    TerminalExit,
    TerminalInput,
    TerminalResize,
    TerminalSize,
)
from kernel_pool import PtySize, SessionPort

router = APIRouter(tags=["terminals"])
logger = logging.getLogger(__name__)
_MESSAGE: TypeAdapter[TerminalClientMessage] = TypeAdapter(TerminalClientMessage)
NORMAL_CLOSURE = 1000


def _terminals(state: State) -> Terminals:
    terminals: Terminals | None = getattr(state, "terminals", None)
    if terminals is None:
        terminals = state.terminals = Terminals()
    return terminals


def _reason(exc: BaseException) -> str:
    detail = detail_for(exc)
    text = detail if isinstance(detail, str) else json.dumps(detail)
    return text.encode()[:120].decode(errors="ignore")  # a close reason holds 123 bytes


def _size(websocket: WebSocket) -> PtySize:
    query = websocket.query_params
    try:
        return PtySize(cols=query.get("cols", "80"), rows=query.get("rows", "24"))
    except ValidationError:
        raise InvalidInput("cols and rows must be whole numbers from 1 to 1000") from None


@router.websocket("/v1/sessions/{session_id}/terminal")
async def terminal_socket(websocket: WebSocket, session_id: str) -> None:
    found = await accept_session(websocket, session_id)
    if found is None:
        return
    gateway, tenant, session = found
    terminals = _terminals(websocket.app.state)
    attach_to = websocket.query_params.get("id")
    try:
        if attach_to:
            terminal = terminals.find(tenant, session.id, attach_to)
        else:
            terminal = await terminals.start(gateway, tenant, session,
                                             websocket.query_params.get("cmd") or DEFAULT_COMMAND,
                                             _size(websocket))
    except DOMAIN_ERRORS as exc:
        await websocket.close(code=close_code_for(exc), reason=_reason(exc))
        return
    listener = terminal.attach()
    sender = asyncio.create_task(_send(websocket, listener))
    receiver = asyncio.create_task(_receive(websocket, gateway, session, terminal))
    try:
        await asyncio.wait({sender, receiver}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        terminal.detach(listener)
        for task in (sender, receiver):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


async def _send(websocket: WebSocket, listener: Listener) -> None:
    while True:
        frame = await listener.frames.get()
        if frame is None:
            await websocket.close(code=WS_CLOSE_LAGGED,
                                  reason="too far behind the terminal; attach again by its id")
            return
        await websocket.send_text(frame.model_dump_json())
        if isinstance(frame, TerminalExit):
            await websocket.close(code=NORMAL_CLOSURE)
            return


async def _receive(websocket: WebSocket, gateway: Gateway, session: SessionPort,
                   terminal: Terminal) -> None:
    with contextlib.suppress(WebSocketDisconnect):
        while True:
            raw = await websocket.receive_text()
            try:
                message = _MESSAGE.validate_json(raw)
            except ValidationError as exc:
                error = MalformedMessage(json.loads(exc.json(include_url=False)))
                await websocket.close(code=close_code_for(error),
                                      reason="not an input, resize or kill message")
                return
            try:
                if isinstance(message, TerminalInput):
                    await session.send_command_input(terminal.id, message.data.encode())
                elif isinstance(message, TerminalResize):
                    await session.resize_command(terminal.id, PtySize(cols=message.cols,
                                                                      rows=message.rows))
                else:
                    await gateway.kill_command(session, terminal.id)
            except DOMAIN_ERRORS as exc:  # it ended meanwhile: its exit frame follows
                logger.debug("terminal %s: %s", terminal.id, exc)


# -- a running command's input ----------------------------------------------------------------

@router.post("/v1/sessions/{session_id}/commands/{command_id}/input",
             status_code=status.HTTP_204_NO_CONTENT)
async def send_input(session_id: str, command_id: str, body: CommandInput, tenant: TenantDep,
                     gateway: GatewayDep) -> Response:
    """Write to the stdin (or terminal) of a command started with ``stdin`` or ``pty``."""
    session = await gateway.session(tenant, session_id)
    await session.send_command_input(command_id, body.data.encode())
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/v1/sessions/{session_id}/commands/{command_id}/close-input",
             status_code=status.HTTP_204_NO_CONTENT)
async def close_input(session_id: str, command_id: str, tenant: TenantDep,
                      gateway: GatewayDep) -> Response:
    """Close a command's stdin: it reads its end."""
    session = await gateway.session(tenant, session_id)
    await session.close_command_input(command_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/v1/sessions/{session_id}/commands/{command_id}/resize",
             status_code=status.HTTP_204_NO_CONTENT)
async def resize(session_id: str, command_id: str, body: TerminalSize, tenant: TenantDep,
                 gateway: GatewayDep) -> Response:
    """Resize the terminal of a command started with ``pty``."""
    session = await gateway.session(tenant, session_id)
    await session.resize_command(command_id, PtySize(cols=body.cols, rows=body.rows))
    return Response(status_code=status.HTTP_204_NO_CONTENT)
