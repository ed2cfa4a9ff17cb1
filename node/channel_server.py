"""The node's end of the channel: executions and new sessions over one kept WebSocket from a
gateway (its end is :mod:`node.channel`), each request's frames tagged with its stream's
number and interleaved with those of the others in flight.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from fastapi import APIRouter, FastAPI, WebSocket, WebSocketDisconnect
from opentelemetry import propagate, trace
from pydantic import ValidationError

from common.tracing import Tracing
from kernel_pool import DoneEvent, InvalidRequest, KernelPool, KernelPoolError
from node.secret_asks import SecretAsks
from node.templates import add_template
from node.wire import (
    PREFIX,
    ChannelFrame,
    ChannelRequest,
    CreateSession,
    ErrorOut,
    Frame,
    Submit,
    stream_of,
)

__all__ = ["error_out", "router", "set_fields"]

logger = logging.getLogger(__name__)
router = APIRouter(prefix=PREFIX)


@router.websocket("/channel")
async def channel(websocket: WebSocket) -> None:
    """Executions and new sessions, over one kept connection from a gateway: each
    :class:`ChannelRequest` queues an execution, whose stream's frames (``accepted``, then its
    events to ``done``, or an ``error``) come back as :class:`ChannelFrame` messages
    interleaved with those of the others in flight, or makes a session (``created``, or an
    ``error``). A WebSocket rather than a request each: an HTTP request and its streamed
    answer cost about 2 ms in Python on each side, a message 0.1 ms.

    An execution runs to its end whatever the gateway does meanwhile: a gateway that goes
    away does not stop code another gateway's watcher may follow. A session being made is
    made (the gateway's claim on this node's slot stands until the heartbeat counts it).

    The other way, the node asks the gateway for the secrets its sessions' egress brokers need
    (:mod:`node.secret_asks`): a :class:`~node.wire.SecretAsk` frame, answered by a request
    carrying only ``answer``.
    """
    await websocket.accept()
    # Unbounded: what is queued is what the executions' handles hold anyway, and the gateway
    # reads on (it reads every stream into its own handle).
    outbox: asyncio.Queue[str] = asyncio.Queue()
    streams: set[asyncio.Task[None]] = set()

    async def send_all() -> None:
        while True:
            await websocket.send_text(await outbox.get())

    sender = asyncio.create_task(send_all())
    asks: SecretAsks = websocket.app.state.secret_asks
    send = outbox.put_nowait
    asks.opened(send)
    try:
        while True:
            raw = await websocket.receive_text()
            try:
                request = ChannelRequest.model_validate_json(raw)
            except ValidationError as exc:
                # Answered on its stream, when it names one; the others in flight go on.
                _refuse(raw, exc, outbox.put_nowait)
                continue
            if request.answer is not None:
                asks.answered(request.answer)
                continue
            task = asyncio.create_task(_stream(websocket.app, request, outbox.put_nowait))
            streams.add(task)
            task.add_done_callback(streams.discard)
    except WebSocketDisconnect:
        pass
    finally:
        asks.closed(send)
        for task in (sender, *streams):
            task.cancel()


def _refuse(raw: str, exc: ValidationError, send: Callable[[str], None]) -> None:
    """A channel request that is not one: an ``error`` and the end on its stream, if a stream
    number can be read from it; else it is only logged (nobody waits for an answer)."""
    stream = stream_of(raw)
    errors = exc.errors(include_url=False, include_input=False)
    logger.warning("a bad request on the channel (stream %s): %s", stream, errors)
    if stream is None:
        return
    error = error_out(InvalidRequest(f"a bad channel request: {len(errors)} "
                                      f"error(s), the first: {errors[0]['msg']}"))
    send(ChannelFrame(stream=stream, frame=Frame(error=error), end=True).model_dump_json(
        include={"stream": True, "frame": {"error"}, "end": True}))


class _FrameSender(Protocol):
    """Sends a frame of a channel request's stream; ``last`` marks the stream's end."""

    def __call__(self, frame: Frame, *, last: bool = False) -> None: ...


async def _stream(app: FastAPI, request: ChannelRequest, send: Callable[[str], None]) -> None:
    """One request on the channel, its frames sent as they come, its last one marked as its
    end (one message fewer a stream); a failure is its stream's last frame (an ``error``),
    never the channel's end."""
    ended = False

    def frame(frame: Frame, *, last: bool = False) -> None:
        nonlocal ended
        if ended:  # (a failure after the last frame: the gateway has let the stream go)
            return
        ended = last
        fields: dict[str, Any] = {"stream": True, "frame": set_fields(frame)}
        if last:
            fields["end"] = True
        send(ChannelFrame(stream=request.stream, frame=frame, end=last).model_dump_json(
            include=fields))

    try:
        if request.create is not None:
            await _create(app, request.create, frame)
        elif request.submit is not None and request.session_id is not None:
            await _execute(app, request.session_id, request.submit, request.trace, frame)
        else:
            raise InvalidRequest("a channel request sends either submit (with session_id) "
                                 "or create")
    except KernelPoolError as exc:
        frame(Frame(error=error_out(exc)), last=True)
    except Exception as exc:  # said to the gateway, which ends the execution with it
        logger.exception("request on the channel failed")
        frame(Frame(error=error_out(KernelPoolError(f"internal error on the node: {exc!r}"))),
              last=True)
    finally:
        if not ended:
            send(ChannelFrame(stream=request.stream, end=True).model_dump_json())


async def _create(app: FastAPI, create: CreateSession, frame: _FrameSender) -> None:
    """A session made: ``created``. Made even if the gateway goes away meanwhile (its claim
    on this node's slot stands until the heartbeat counts it)."""
    pool: KernelPool = app.state.pool
    if create.template is not None:
        await add_template(pool, create.template, app.state.images)
    made = await asyncio.shield(pool.create_session(
        create.profile, env=create.env, metadata=create.metadata,
        session_id=create.session_id, lost=create.lost))
    frame(Frame(created=made.state()), last=True)


async def _execute(app: FastAPI, session_id: str, body: Submit, trace_context: dict[str, str],
                   frame: _FrameSender) -> None:
    """An execution queued: ``accepted``, then its events to its ``done``."""
    pool: KernelPool = app.state.pool
    session = pool.get_session(session_id)
    handle = session.submit(body.code, body.timeout_s, execution_id=body.execution_id,
                            language=body.language, context_id=body.context_id)
    if body.origin is not None:  # (set before its task first tells the listeners)
        app.state.origins[handle] = body.origin
    tracing: Tracing | None = app.state.tracing
    span = None if tracing is None else tracing.tracer.start_span(
        "replgate.node.execution", kind=trace.SpanKind.SERVER,
        context=propagate.extract(trace_context))
    frame(Frame(accepted=session.state()))
    async for event in handle.stream():
        frame(Frame(event=event), last=isinstance(event, DoneEvent))
    if tracing is not None and span is not None:
        # Its queue and its run in the kernel, here, under the node's span for it.
        tracing.draw_run(trace.set_span_in_context(span), handle)
        span.end()


def error_out(exc: KernelPoolError) -> ErrorOut:
    """The frame's or answer's error: the class's name (the gateway raises the same class)
    and its sentence."""
    return ErrorOut(error=type(exc).__name__, detail=str(exc))


def set_fields(frame: Frame) -> set[str]:
    """The fields a frame is sent with."""
    # Only the frame's unset fields are left out: a null inside (a killed command's exit
    # code, a died execution's count) is the answer's.
    return {name for name, value in frame if value is not None}
