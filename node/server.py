"""The port served by a node: its kernel pool's sessions, over HTTP to gateways.

Only gateways reach it (mutual TLS: :mod:`node.tls`), so it checks no API key and knows no
tenant; the gateway did both, and holds approvals before it submits. An execution, a shell
command, a raw Jupyter request and a session's followed events answer a stream of
:class:`~node.wire.Frame` lines; everything else answers one model, or an
:class:`~node.wire.ErrorOut` with the status the gateway would give the same error.
Executions and new sessions come over the channel instead (:mod:`node.channel_server`).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from common.errors import status_for
from common.metrics import Metrics
from common.tracing import Tracing
from kernel_pool import (
    ContextInfo,
    EgressAttempt,
    Event,
    ExecutionHandle,
    KernelPool,
    KernelPoolError,
    SandboxUsage,
    Session,
    SessionPort,
    StreamEvent,
    Transfer,
)
from kernel_pool.bundles import BundleStore
from node.channel_server import error_out, set_fields
from node.channel_server import router as channel_router
from node.command_input import router as command_input_router
from node.files_server import router as files_router
from node.restore import router as restore_router
from node.sandbox_fs import router as sandbox_fs_router
from node.secret_asks import SecretAsks
from node.snapshots import router as snapshots_router
from node.watch_server import router as watch_router
from node.wire import (
    PREFIX,
    CreateContext,
    Executed,
    ForkSession,
    Frame,
    Interrupted,
    Killed,
    NodeInfo,
    Relay,
    Relayed,
    RunCommand,
    SessionState,
    SetNetwork,
    Started,
)

router = APIRouter(prefix=PREFIX)
FOLLOW_BUFFER = 4096
"""Frames a follower of a session may fall behind before its stream is ended (it follows
again, having missed some)."""
TERMINAL_BACKLOG = 1024
"""Output events of a terminal a gateway may fall behind on before they are dropped."""
FOLLOW_KEEPALIVE_S = 5.0
"""How often a quiet follower's stream carries an empty line: a gateway gone is noticed, and
a session closed ends the stream."""


def _pool(request: Request) -> KernelPool:
    pool: KernelPool = request.app.state.pool
    return pool


def _session(request: Request, session_id: str) -> Session:
    return _pool(request).get_session(session_id)


def _origins(request: Request) -> weakref.WeakKeyDictionary[ExecutionHandle, str]:
    """Who submitted each execution (``Submit.origin``), as long as it is kept."""
    origins: weakref.WeakKeyDictionary[ExecutionHandle, str] = request.app.state.origins
    return origins


@router.get("/info")
async def info(request: Request) -> NodeInfo:
    pool = _pool(request)
    return NodeInfo(id=request.app.state.node_id, profiles=list(pool.settings.profiles.values()),
                    stats=pool.stats(), image=request.app.state.image)


@router.get("/sessions")
async def listed(request: Request) -> list[SessionState]:
    return [s.state() for s in _pool(request).sessions.values()]


@router.get("/sessions/{session_id}")
async def state(request: Request, session_id: str) -> SessionState:
    return _session(request, session_id).state()


@router.delete("/sessions/{session_id}", status_code=204)
async def delete(request: Request, session_id: str) -> None:
    await _pool(request).delete_session(session_id)


@router.post("/sessions/{session_id}/fork")
async def fork(request: Request, session_id: str, body: ForkSession) -> list[SessionState]:
    children = await _pool(request).fork_session(session_id, body.count, body.metadata)
    return [child.state() for child in children]


@router.post("/sessions/{session_id}/interrupt")
async def interrupt(request: Request, session_id: str,
                    context_id: str | None = None) -> Interrupted:
    return Interrupted(interrupted=await _session(request, session_id).interrupt(context_id))


@router.post("/sessions/{session_id}/restart")
async def restart(request: Request, session_id: str) -> SessionState:
    session = _session(request, session_id)
    await session.restart()
    return session.state()


@router.post("/sessions/{session_id}/pause")
async def pause(request: Request, session_id: str) -> SessionState:
    session = _session(request, session_id)
    await session.pause()
    return session.state()


@router.post("/sessions/{session_id}/resume")
async def resume(request: Request, session_id: str) -> SessionState:
    session = _session(request, session_id)
    await session.resume()
    return session.state()


@router.get("/sessions/{session_id}/usage")
async def usage(request: Request, session_id: str) -> SandboxUsage:
    return await _session(request, session_id).usage()


@router.get("/sessions/{session_id}/egress")
async def egress(request: Request, session_id: str) -> list[EgressAttempt]:
    return await _session(request, session_id).egress_attempts()


@router.put("/sessions/{session_id}/network")
async def set_network(request: Request, session_id: str, body: SetNetwork) -> SessionState:
    """Apply the session's network policy to its proxy, here on its node."""
    session = _session(request, session_id)
    await session.set_network(body.policy)
    return session.state()


@router.post("/sessions/{session_id}/commands")
async def run_command(request: Request, session_id: str, body: RunCommand) -> StreamingResponse:
    """Run a shell command; the stream carries its output events, then its result.

    A request refused (an empty command, too many running) answers its error at once. The
    command is the stream's: a gateway that goes away (its caller gone) stops it.
    """
    session = _session(request, session_id)
    run = session.prepare_command(body.command, timeout_s=body.timeout_s, env=body.env,
                                  cwd=body.cwd, command_id=body.command_id,
                                  stdin=body.stdin, pty=body.pty)
    output: asyncio.Queue[StreamEvent | None] = asyncio.Queue()  # the caps bound it

    def emitted(event: StreamEvent) -> None:
        # A terminal's output is not capped: what a slow gateway is this far behind on is
        # dropped (a screen is drawn again by what follows) rather than held without end.
        if body.pty is None or output.qsize() < TERMINAL_BACKLOG:
            output.put_nowait(event)

    def frame(said: StreamEvent | None) -> Frame:
        # None is the command's start, queued before any of its output.
        return Frame(command_started=run.id) if said is None else Frame(event=said)

    async def lines() -> AsyncIterator[bytes]:
        running = asyncio.ensure_future(session.run_prepared(
            run, emitted, lambda: output.put_nowait(None)))
        try:
            while not running.done():
                getting = asyncio.ensure_future(output.get())
                await asyncio.wait({getting, running}, return_when=asyncio.FIRST_COMPLETED)
                if getting.done():
                    yield _line(frame(getting.result()))
                else:
                    getting.cancel()
            while not output.empty():
                yield _line(frame(output.get_nowait()))
            try:
                yield _line(Frame(command=running.result()))
            except KernelPoolError as exc:
                yield _line(Frame(error=error_out(exc)))
        finally:
            if not running.done():
                running.cancel()  # the command is killed with its process group
                with contextlib.suppress(BaseException):
                    await running

    return StreamingResponse(lines(), media_type="application/x-ndjson")


@router.post("/sessions/{session_id}/commands/{command_id}/kill")
async def kill_command(request: Request, session_id: str, command_id: str) -> Killed:
    return Killed(killed=await _session(request, session_id).kill_command(command_id))


@router.post("/sessions/{session_id}/relay")
async def relay(request: Request, session_id: str, body: Relay) -> StreamingResponse:
    """One raw Jupyter request; the stream carries the messages it caused until the kernel is
    idle again, or the error that ended it."""
    session = _session(request, session_id)

    async def lines() -> AsyncIterator[bytes]:
        try:
            async for channel, message in session.relay(body.msg_type, body.content,
                                                         channel=body.channel):
                buffers = [bytes(b) for b in message.get("buffers") or ()]
                kept = {k: v for k, v in message.items() if k != "buffers"}
                yield _line(Frame(relayed=Relayed(channel=channel, message=kept,
                                                  buffers=buffers)))
        except KernelPoolError as exc:
            yield _line(Frame(error=error_out(exc)))

    return StreamingResponse(lines(), media_type="application/x-ndjson")


@router.get("/sessions/{session_id}/contexts")
async def list_contexts(request: Request, session_id: str) -> list[ContextInfo]:
    return await _session(request, session_id).list_contexts()


@router.post("/sessions/{session_id}/contexts")
async def create_context(request: Request, session_id: str, body: CreateContext) -> ContextInfo:
    return await _session(request, session_id).create_context(body.language, body.cwd)


@router.post("/sessions/{session_id}/contexts/{context_id}/restart")
async def restart_context(request: Request, session_id: str, context_id: str) -> SessionState:
    session = _session(request, session_id)
    await session.restart_context(context_id)
    return session.state()


@router.delete("/sessions/{session_id}/contexts/{context_id}")
async def remove_context(request: Request, session_id: str, context_id: str) -> SessionState:
    session = _session(request, session_id)
    await session.remove_context(context_id)
    return session.state()


@router.get("/sessions/{session_id}/events")
async def follow(request: Request, session_id: str,
                 origin: str | None = None) -> StreamingResponse:
    """What the session's listeners hear: each execution's start and events (but those
    submitted by ``origin``, which has them already), and each transfer (a pause's or
    resume's progress). The first line is the session's state (the follower is attached from
    then on)."""
    session = _session(request, session_id)
    origins = _origins(request)

    async def lines() -> AsyncIterator[bytes]:
        queue: asyncio.Queue[Frame | None] = asyncio.Queue(FOLLOW_BUFFER)

        def put(frame: Frame) -> None:
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(frame)
                return
            with contextlib.suppress(asyncio.QueueEmpty):  # too far behind: end, keep none
                while True:
                    queue.get_nowait()
            queue.put_nowait(None)

        def heard(_session: SessionPort, handle: ExecutionHandle, event: Event | None) -> None:
            if origin is not None and origins.get(handle) == origin:
                return
            put(Frame(started=Started(
                execution_id=handle.id, code=handle.code, timeout_s=handle.timeout_s,
                language=handle.language, context_id=handle.context_id)) if event is None
                else Frame(executed=Executed(execution_id=handle.id, event=event)))

        def moved(_session: SessionPort, transfer: Transfer) -> None:
            put(Frame(transfer=transfer))

        session.listeners.append(heard)
        session.transfer_listeners.append(moved)
        try:
            yield _line(Frame(accepted=session.state()))
            while not session.closed:
                try:
                    frame = await asyncio.wait_for(queue.get(), FOLLOW_KEEPALIVE_S)
                except TimeoutError:
                    yield b"\n"
                    continue
                if frame is None:
                    return
                yield _line(frame)
        finally:
            session.listeners.remove(heard)
            session.transfer_listeners.remove(moved)

    return StreamingResponse(lines(), media_type="application/x-ndjson")


def _line(frame: Frame) -> bytes:
    return frame.model_dump_json(include=set_fields(frame)).encode() + b"\n"


def create_node_app(pool: KernelPool, node_id: str, image: str, *,
                    lifespan: Callable[[FastAPI], Any] | None = None,
                    tracing: Tracing | None = None, images: BundleStore | None = None) -> FastAPI:
    """The port over ``pool``'s sessions, as an ASGI app (the pool is started by the caller);
    with ``tracing``, a span per request, and each execution's run drawn under its request's;
    ``images``: where custom templates' images are loaded from (:mod:`node.templates`)."""
    app = FastAPI(title="replgate node", lifespan=lifespan, openapi_url=None, docs_url=None,
                  redoc_url=None)
    app.state.pool = pool
    app.state.node_id = node_id
    app.state.image = image
    app.state.origins = weakref.WeakKeyDictionary()
    app.state.tracing = tracing
    app.state.images = images
    # Its sessions' brokers ask the gateways' channels for secrets (before any kernel is made:
    # warm ones broker too); the node keeps none.
    app.state.secret_asks = SecretAsks()
    pool.secret_source = app.state.secret_asks.source
    if tracing is not None:
        tracing.instrument_app(app)

    @app.exception_handler(KernelPoolError)
    async def pool_error(request: Request, exc: KernelPoolError) -> JSONResponse:
        return JSONResponse(error_out(exc).model_dump(), status_code=status_for(exc))

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "node": node_id}

    figures = Metrics(pool)

    @app.get("/metrics")
    async def metrics() -> Response:
        """The node's kernels and sessions, as Prometheus text (over mutual TLS, as all)."""
        return Response(figures.render(), media_type="text/plain; version=0.0.4")

    app.include_router(router)
    app.include_router(channel_router)  # executions and new sessions, over one WebSocket
    app.include_router(restore_router)  # sessions moving through the bundle store
    app.include_router(snapshots_router)  # saved snapshots, in the bundle store too
    app.include_router(files_router)  # the workspace's files
    app.include_router(command_input_router)  # a running command's stdin and terminal
    app.include_router(watch_router)  # folders watched
    app.include_router(sandbox_fs_router)  # the sandbox's own files, outside the workspace
    return app


__all__ = ["create_node_app"]
