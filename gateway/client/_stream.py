"""Executions streamed over a session's WebSocket, with a callback per event as it arrives.

One socket per sandbox, opened on first use, kept across executions and reopened when it was
closed. Executions on it run one at a time: each sends ``{"type": "execute", "id": ...}`` and
reads until the ``done`` event carrying that id, skipping events of any other execution (such as
the rest of one whose caller was cancelled). A ``rejected`` frame for it (a refused timeout, a
full queue, code over the size limit) raises the matching :class:`ReplgateError` at once. A
paused session's resume that the execution causes comes first, as ``transfer`` frames.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.protocol import State

from gateway.wire import (
    EVENT_TYPES,
    DisplayEvent,
    DoneEvent,
    ErrorEvent,
    EventFrame,
    Execution,
    ExecutionBuilder,
    StreamEvent,
    TransferFrame,
    WsExecute,
)

from ._errors import (
    AuthenticationError,
    ReplgateError,
    TransportError,
    error_for_status,
)
from ._tracecontext import trace_fields

StreamCallback = Callable[[StreamEvent], object]
"""Called with each ``stdout``/``stderr`` event; may be a plain function or a coroutine function."""
DisplayCallback = Callable[[DisplayEvent], object]
"""Called with each ``display``/``result`` event; plain function or coroutine function."""
ErrorCallback = Callable[[ErrorEvent], object]
"""Called with the ``error`` event of an exception in the code; plain or coroutine function."""
TransferCallback = Callable[[TransferFrame], object]
"""Called with the progress of the paused session's resume the execution waits for (before
any output); plain function or coroutine function."""

# A rich output (an image) arrives as one message; the gateway caps outputs, so this bound only
# guards against a misbehaving peer, well above websockets' 1 MiB default.
_MAX_MESSAGE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class Handlers:
    """The callbacks of one execution; each may be ``None``.

    With ``whole_lines`` (the default), ``on_stdout``/``on_stderr`` get whole lines only: an
    unfinished line waits for its end, for the next display or error, or for the execution's
    end. Without it they get the gateway's events as they come (an unfinished line the code
    left for a while, such as a progress indicator, then shows at once).
    """

    on_stdout: StreamCallback | None = None
    on_stderr: StreamCallback | None = None
    on_display: DisplayCallback | None = None
    on_error: ErrorCallback | None = None
    on_transfer: TransferCallback | None = None
    whole_lines: bool = True
    _held: dict[str, str] = field(default_factory=dict, repr=False)

    async def dispatch(self, event: Any) -> None:
        """Call the callback this event is for, awaiting it if it returned an awaitable."""
        if isinstance(event, StreamEvent) and self.whole_lines:
            text = self._held.pop(event.type, "") + event.text
            cut = text.rfind("\n") + 1
            if cut < len(text):
                self._held[event.type] = text[cut:]
            if not cut:
                return
            event = StreamEvent(type=event.type, text=text[:cut])
        elif self._held:  # what is left of a line goes before what came after it
            for name, text in list(self._held.items()):
                del self._held[name]
                await self._call(StreamEvent(type=name, text=text))
        await self._call(event)

    async def _call(self, event: Any) -> None:
        callback: Callable[[Any], object] | None = None
        if isinstance(event, StreamEvent):
            callback = self.on_stdout if event.type == "stdout" else self.on_stderr
        elif isinstance(event, DisplayEvent):
            callback = self.on_display
        elif isinstance(event, ErrorEvent):
            callback = self.on_error
        elif isinstance(event, TransferFrame):
            callback = self.on_transfer
        if callback is not None:
            result = callback(event)
            if inspect.isawaitable(result):
                await result


class ExecutionStream:
    """A sandbox's WebSocket, running one execution at a time."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self._url = url
        self._headers = headers
        self._socket: ClientConnection | None = None
        self._lock = asyncio.Lock()

    async def run(self, code: str, timeout_s: float | None, handlers: Handlers, *,
                  language: str | None = None, context_id: str | None = None) -> Execution:
        """Execute ``code`` (in ``language``'s or ``context_id``'s context), calling
        ``handlers`` per event; the aggregate once ``done`` came."""
        execution_id = str(uuid.uuid4())
        # Not validated here: the gateway judges the values, and its answer names the limit.
        context = trace_fields()  # the caller's trace, which this execution's spans join
        request = WsExecute.model_construct(type="execute", code=code, id=execution_id,
                                            timeout_s=timeout_s, language=language,
                                            context_id=context_id,
                                            traceparent=context.get("traceparent"),
                                            tracestate=context.get("tracestate"))
        builder = ExecutionBuilder()
        async with self._lock:
            socket = await self._send(request.model_dump_json(exclude_none=True), execution_id)
            while True:
                event = await self._receive(socket, execution_id)
                if event is None:
                    continue
                if not isinstance(event, TransferFrame):
                    builder.add(event)
                await handlers.dispatch(event)
                if isinstance(event, DoneEvent):
                    return builder.build()

    async def aclose(self) -> None:
        """Close the socket, if one is open."""
        socket, self._socket = self._socket, None
        if socket is not None:
            await socket.close()

    async def _send(self, message: str, execution_id: str) -> ClientConnection:
        socket = await self._open()
        try:
            await socket.send(message)
            return socket
        except ConnectionClosed:
            # An idle socket the gateway or a proxy closed: send() wrote nothing, so one retry
            # on a fresh socket cannot run the code twice.
            self._socket = None
        socket = await self._open()
        try:
            await socket.send(message)
        except ConnectionClosed as exc:
            self._socket = None
            raise _closed_error(exc, execution_id) from exc
        return socket

    async def _receive(self, socket: ClientConnection, execution_id: str) -> Any:
        try:
            raw = await socket.recv()
        except ConnectionClosed as exc:
            self._socket = None
            raise _closed_error(exc, execution_id) from exc
        try:
            message = json.loads(raw)
        except ValueError as exc:
            raise ReplgateError(f"The gateway sent a message that is not JSON: {raw!r:.200}",
                                detail=str(raw)) from exc
        if not isinstance(message, dict):
            return None
        if message.get("type") == "rejected" and message.get("execution_id") in (execution_id,
                                                                                  None):
            # The gateway refused the request instead of running it. A refusal without an id
            # is one whose message it could not read, and this socket carries one message at
            # a time: ours.
            raise _rejected_error(message, execution_id)
        kind = message.get("type")
        if message.get("execution_id") != execution_id or kind not in {*EVENT_TYPES, "transfer"}:
            return None  # another execution's event, or a kind this client predates
        try:
            if kind == "transfer":
                return TransferFrame.model_validate(message)
            return EventFrame.model_validate(message).event
        except ValidationError as exc:
            raise ReplgateError(f"The gateway sent an event this client cannot read: {exc}",
                                detail=message) from exc

    async def _open(self) -> ClientConnection:
        if self._socket is not None and self._socket.state is State.OPEN:
            return self._socket
        try:
            self._socket = await connect(self._url, additional_headers=self._headers,
                                         max_size=_MAX_MESSAGE_BYTES)
        except InvalidStatus as exc:
            raise _refused_error(exc.response.status_code, exc.response.body) from exc
        except (OSError, TimeoutError, WebSocketException) as exc:
            raise TransportError(
                f"Could not open the WebSocket {self._url} ({exc!r}). Check that the gateway "
                "runs there (base_url= / REPLGATE_URL).") from exc
        return self._socket


def _refused_error(status_code: int, body: bytes | bytearray) -> ReplgateError:
    try:
        detail: Any = json.loads(body)["detail"]
    except (ValueError, KeyError, TypeError):
        detail = body.decode(errors="replace") or f"HTTP {status_code}"
    if status_code == 403:
        # The contract lets the gateway refuse a bad key at the upgrade with 403 as well as 401.
        return AuthenticationError(
            f"The gateway refused the WebSocket (HTTP 403: {detail}). Check the API key "
            "(api_key= / REPLGATE_API_KEY) and that the session still exists.",
            status_code=403, detail=detail)
    return error_for_status(status_code, detail)


def _rejected_error(message: dict[str, Any], execution_id: str,
                    what: str = "Execution") -> ReplgateError:
    status = message.get("status_code")
    detail = message.get("detail")
    if not isinstance(status, int) or not 400 <= status < 600:
        status = 400
    error = error_for_status(status, detail if detail is not None else "request rejected")
    error.message = f"{what} {execution_id} was not run: {error.message}"
    error.args = (error.message,)
    return error


def _closed_error(exc: ConnectionClosed, execution_id: str) -> ReplgateError:
    code = exc.rcvd.code if exc.rcvd is not None else None
    reason = exc.rcvd.reason if exc.rcvd is not None else ""
    if code is not None and 4400 <= code < 4600:
        # Application close codes mirror HTTP statuses: 4401 is 401, 4404 is 404, ...
        return error_for_status(code - 4000, reason or f"WebSocket closed with code {code}")
    return TransportError(
        f"The WebSocket to the gateway closed (code {code}{': ' + reason if reason else ''}) "
        f"before execution {execution_id} finished. The code may still be running: check "
        "sandbox.info(), stop it with sandbox.interrupt().", detail=reason or None)
