"""Jupyter's kernel API, in Jupyter Kernel Gateway's shape, on replgate sessions: ``/api/...``.

A kernel is a session of the caller's tenant: started through ``Gateway.create_session`` (ids
are dashed UUIDs, which jupyter_server's URL patterns require), listed by ``/v1/sessions`` too,
and another tenant's is a 404. Profiles are the kernelspecs, the default profile named
``python3``. Auth is the API's: ``Authorization: token <key>`` (jupyter_server's gateway client),
``Bearer <key>`` or ``?token=<key>``.

``/api/kernels/{id}/channels`` speaks Jupyter's kernel WebSocket protocol, JSON or the
``v1.kernel.websocket.jupyter.org`` binary subprotocol when the client offers it.
``execute_request`` runs through the gateway's engine (limits, real timeouts, output caps,
history, audit, notebook export) and its outcome is told back as Jupyter messages; the other
shell and control requests are relayed to the kernel and its replies rebuilt from their parsed
content (:mod:`gateway.jupyter_protocol`). stdin is not offered: ``input()`` fails fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Request, Response, WebSocket, status
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field

from gateway import __version__
from gateway.auth import extract_token
from gateway.deps import GatewayDep, TenantDep
from gateway.errors import GatewayError, status_for
from gateway.jupyter_protocol import (
    V1_SUBPROTOCOL,
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
from gateway.models import EnvName, SessionCreate
from gateway.routers.ws import origin_allowed
from gateway.service import Gateway
from kernel_pool.config import Profile
from kernel_pool.events import (
    ApprovalEvent,
    DisplayEvent,
    DoneEvent,
    ErrorEvent,
    ExecutionStatus,
    PendingApprovalEvent,
    StreamEvent,
)
from kernel_pool.exceptions import KernelPoolError
from kernel_pool.kernel import Kernel
from kernel_pool.session import Session, SessionStatus

logger = logging.getLogger(__name__)

DEFAULT_KERNEL = "python3"
SEND_BUFFER = 256
MAX_QUEUED_EXECUTES = 128
MAX_QUEUED_CODE_BYTES = 16 * 1024 * 1024
MAX_RELAYS = 32
RELAYED = frozenset({"kernel_info_request", "complete_request", "inspect_request",
                     "is_complete_request", "comm_info_request", "history_request"})


class JupyterRoute(APIRoute):
    """Errors also carry Kernel Gateway's ``reason`` and ``message``, which jupyter_server shows."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except (GatewayError, KernelPoolError) as exc:
                code = status_for(exc)
                if code >= 500:
                    raise  # the app's handler logs it
                headers = {"WWW-Authenticate": "Bearer"} if code == 401 else (
                    {"Retry-After": "5"} if code == 429 else None)
                return JSONResponse({"detail": str(exc), "message": str(exc),
                                     "reason": HTTPStatus(code).phrase},
                                    status_code=code, headers=headers)

        return route


router = APIRouter(tags=["jupyter"], route_class=JupyterRoute)


class KernelCreate(BaseModel):
    """``POST /api/kernels``: what jupyter_server's gateway client sends (other keys ignored)."""

    model_config = ConfigDict(extra="ignore")
    name: str | None = Field(None, max_length=128)
    env: dict[EnvName, Annotated[str, Field(max_length=32_768)]] = Field(
        default_factory=dict, max_length=256)


class KernelModel(BaseModel):
    id: str
    name: str
    last_activity: str
    execution_state: str
    connections: int


# -- kernelspecs and models ----------------------------------------------------------------------


def kernel_name(profile: str) -> str:
    return DEFAULT_KERNEL if profile == "default" else profile


def kernelspec(profile: Profile) -> dict[str, Any]:
    name = kernel_name(profile.name)
    label = "sandbox" if profile.name == "default" else profile.name
    return {"name": name, "resources": {}, "spec": {
        "argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python 3 (replgate {label})", "language": "python",
        "interrupt_mode": "message", "env": {},
        "metadata": {"replgate": {"profile": profile.name, "memory": profile.memory,
                                  "cpus": profile.cpus, "timeout_s": profile.default_timeout_s,
                                  "max_timeout_s": profile.max_timeout_s}}}}


def _profile(gateway: Gateway, name: str) -> Profile:
    wanted = "default" if name == DEFAULT_KERNEL else name
    profile = gateway.pool.settings.profiles.get(wanted)
    if profile is None or kernel_name(profile.name) != name:
        raise GatewayError(f"no kernelspec named {name!r}; GET /api/kernelspecs lists them", 404)
    return profile


def connections(app: FastAPI) -> Counter[str]:
    """Open channel WebSockets per kernel (the model's ``connections``)."""
    counter: Counter[str] | None = getattr(app.state, "jupyter_connections", None)
    if counter is None:
        counter = app.state.jupyter_connections = Counter()
    return counter


def kernel_model(session: Session, app: FastAPI) -> KernelModel:
    active = datetime.fromisoformat(session.last_active_at).astimezone(UTC)
    return KernelModel(id=session.id, name=kernel_name(session.profile.name),
                       last_activity=active.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                       # Jupyter knows no "paused": such a kernel is idle, resumed on use.
                       execution_state="idle" if session.status is SessionStatus.PAUSED
                       else session.status.value,
                       connections=connections(app)[session.id])


# -- REST ----------------------------------------------------------------------------------------


@router.get("/api")
async def api_version(tenant: TenantDep) -> dict[str, str]:
    return {"version": __version__}


@router.get("/api/kernelspecs")
async def list_kernelspecs(tenant: TenantDep, gateway: GatewayDep) -> dict[str, Any]:
    profiles = gateway.pool.settings.profiles.values()
    return {"default": DEFAULT_KERNEL,
            "kernelspecs": {kernel_name(p.name): kernelspec(p) for p in profiles}}


@router.get("/api/kernelspecs/{name}")
async def get_kernelspec(name: str, tenant: TenantDep, gateway: GatewayDep) -> dict[str, Any]:
    return kernelspec(_profile(gateway, name))


@router.get("/api/kernels")
async def list_kernels(request: Request, tenant: TenantDep,
                       gateway: GatewayDep) -> list[KernelModel]:
    return [kernel_model(s, request.app) for s in gateway.sessions(tenant)]


@router.post("/api/kernels", status_code=status.HTTP_201_CREATED)
async def start_kernel(request: Request, response: Response, tenant: TenantDep,
                       gateway: GatewayDep, body: KernelCreate | None = None) -> KernelModel:
    """A new session on a warm kernel; ``env`` reaches the kernel as given."""
    body = body or KernelCreate()
    profile = _profile(gateway, body.name or DEFAULT_KERNEL)
    session = await gateway.create_session(
        tenant, SessionCreate(profile=profile.name, env=body.env), session_id=str(uuid.uuid4()))
    response.headers["Location"] = f"/api/kernels/{session.id}"
    return kernel_model(session, request.app)


@router.get("/api/kernels/{kernel_id}")
async def get_kernel(kernel_id: str, request: Request, tenant: TenantDep,
                     gateway: GatewayDep) -> KernelModel:
    return kernel_model(gateway.session(tenant, kernel_id), request.app)


@router.delete("/api/kernels/{kernel_id}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_kernel(kernel_id: str, tenant: TenantDep, gateway: GatewayDep) -> Response:
    await gateway.delete_session(tenant, kernel_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/api/kernels/{kernel_id}/interrupt", status_code=status.HTTP_204_NO_CONTENT)
async def interrupt_kernel(kernel_id: str, tenant: TenantDep, gateway: GatewayDep) -> Response:
    gateway.session(tenant, kernel_id).interrupt()
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/api/kernels/{kernel_id}/restart")
async def restart_kernel(kernel_id: str, request: Request, tenant: TenantDep,
                         gateway: GatewayDep) -> KernelModel:
    """A fresh kernel on the same workspace: variables gone, files kept."""
    return kernel_model(await gateway.restart(tenant, kernel_id), request.app)


# -- channels ------------------------------------------------------------------------------------


@router.websocket("/api/kernels/{kernel_id}/channels")
async def kernel_channels(websocket: WebSocket, kernel_id: str) -> None:
    gateway: Gateway = websocket.app.state.gateway
    if not origin_allowed(websocket, gateway.settings.allowed_origins):
        await _refuse(websocket, 403, "origin not allowed")
        return
    token = extract_token(websocket.headers.get("authorization"),
                          websocket.query_params.get("token"))
    try:
        tenant = await gateway.authenticate(token)
        session = gateway.session(tenant, kernel_id)
    except (GatewayError, KernelPoolError) as exc:
        await _refuse(websocket, status_for(exc), str(exc))
        return
    binary = V1_SUBPROTOCOL in websocket.scope.get("subprotocols", [])
    await websocket.accept(subprotocol=V1_SUBPROTOCOL if binary else None)
    counter = connections(websocket.app)
    counter[session.id] += 1
    try:
        await KernelChannels(websocket, gateway, tenant, session, binary).serve()
    finally:
        counter[session.id] -= 1
        if counter[session.id] <= 0:
            del counter[session.id]


async def _refuse(websocket: WebSocket, code: int, detail: str) -> None:
    """Refuse the upgrade with an HTTP status (a plain 403 where the server cannot)."""
    try:
        await websocket.send_denial_response(JSONResponse({"detail": detail}, status_code=code))
    except RuntimeError:
        await websocket.close(code=1008, reason=detail[:120])


class KernelChannels:
    """One channels WebSocket: a receiver, an executor running execute_requests in order,
    relays for other requests, and one sender owning the socket's writes (bounded queue)."""

    def __init__(self, websocket: WebSocket, gateway: Gateway, tenant: str, session: Session,
                 binary: bool) -> None:
        self.websocket = websocket
        self.gateway = gateway
        self.tenant = tenant
        self.session = session
        self.binary = binary
        self.key = uuid.uuid4().hex
        """``session`` of the gateway's messages on this connection."""
        self._outbox: asyncio.Queue[str | bytes] = asyncio.Queue(SEND_BUFFER)
        self._executes: asyncio.Queue[tuple[Message, int]] = asyncio.Queue(MAX_QUEUED_EXECUTES)
        self._queued_bytes = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = asyncio.Event()

    def _on_closed(self, session: Session, reason: str) -> None:
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
            frame = await self._outbox.get()
            try:
                if isinstance(frame, bytes):
                    await self.websocket.send_bytes(frame)
                else:
                    await self.websocket.send_text(frame)
            finally:
                self._outbox.task_done()

    async def _emit(self, message: Message) -> None:
        await self._outbox.put(encode(message, self.binary))

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
            self.session.interrupt()
            await self._reply(request, "interrupt_reply", {"status": "ok"})
        elif kind == "shutdown_request":
            self._spawn(self._shutdown(request))
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
            await self.gateway.restart(self.tenant, self.session.id)
        await self._reply(request, "shutdown_reply", {"status": "ok", "restart": restart})

    # -- relayed requests --------------------------------------------------------------------

    async def _ready_kernel(self) -> Kernel | None:
        if self.session.paused:  # a request that needs the kernel resumes the session
            await self.session.resume()
        for _ in range(600):
            if self.session.closed:
                return None
            if self.session.status != SessionStatus.STARTING:
                return self.session.kernel
            await asyncio.sleep(0.1)
        return None

    async def _relay(self, request: Message) -> None:
        """Send the request to the kernel; re-emit its reply and its busy/idle status."""
        kind = request.msg_type
        reply_type = kind.removesuffix("_request") + "_reply"
        try:
            kernel = await self._ready_kernel()
            if kernel is None:
                raise RuntimeError("the kernel is not running")
            # kernel_info on control is answered even while code runs (as jupyter_server does)
            channel = "control" if kind == "kernel_info_request" else request.channel
            msg_id, route = kernel.request(kind, request.content, channel)
        except Exception as exc:
            await self._reply(request, reply_type, {"status": "error", "ename": "KernelUnavailable",
                                                    "evalue": str(exc), "traceback": []})
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.session.profile.max_timeout_s + 60
        replied = idle = False
        try:
            while not (replied and idle):
                try:
                    async with asyncio.timeout_at(deadline):
                        channel, msg = await route.get()
                except TimeoutError:
                    return
                if channel == "died" or not isinstance(msg, dict):
                    return
                msg_type = msg.get("msg_type")
                if channel in ("shell", "control") and msg_type == reply_type and not replied:
                    reply = from_kernel(msg, channel=request.channel, parent=request.header,
                                        session=self.key)
                    if msg_type == "kernel_info_reply":
                        reply.content["debugger"] = False  # debug_request is not relayed
                    await self._emit(reply)
                    replied = True
                    deadline = min(deadline, loop.time() + 1.0)
                elif channel == "iopub" and msg_type == "status":
                    content = msg.get("content")
                    state = content.get("execution_state") if isinstance(content, dict) else None
                    if state in ("busy", "idle"):
                        await self._status(request, state)
                        idle = state == "idle"
        finally:
            kernel.forget(msg_id)

    # -- executions --------------------------------------------------------------------------

    async def _enqueue(self, request: Message) -> None:
        code = request.content.get("code")
        size = len(code.encode("utf-8", "surrogatepass")) if isinstance(code, str) else 0
        if self._queued_bytes + size > MAX_QUEUED_CODE_BYTES or self._executes.full():
            await self._status(request, "busy")
            await self._fail(request, "TooManyRequests",
                             "too many executions queued on this connection; wait for some")
            return
        self._queued_bytes += size
        self._executes.put_nowait((request, size))

    def _dequeue(self, item: tuple[Message, int]) -> Message:
        self._queued_bytes -= item[1]
        return item[0]

    async def _run_executes(self) -> None:
        """One execute_request at a time, in order; after a failed one that asked
        ``stop_on_error`` (the default), those already queued are aborted, as ipykernel does."""
        while True:
            request = self._dequeue(await self._executes.get())
            ok = await self._execute(request)
            if not ok and request.content.get("stop_on_error", True) is not False:
                while not self._executes.empty():
                    aborted = self._dequeue(self._executes.get_nowait())
                    await self._status(aborted, "busy")
                    await self._reply(aborted, "execute_reply", {"status": "aborted"})
                    await self._status(aborted, "idle")

    async def _fail(self, request: Message, ename: str, evalue: str) -> None:
        error = ErrorEvent(ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])
        count = self.session.execution_count
        await self._emit(output_message(error, parent=request.header, session=self.key,
                                        execution_count=count))
        await self._reply(request, "execute_reply", {
            "status": "error", "execution_count": count, "ename": ename, "evalue": evalue,
            "traceback": error.traceback})
        await self._status(request, "idle")

    async def _execute(self, request: Message) -> bool:
        """Run one execute_request through the engine; True when it ended ``ok``."""
        code, silent = request.content.get("code"), request.content.get("silent") is True
        parent = request.header
        await self._status(request, "busy")
        try:
            if not isinstance(code, str):
                raise GatewayError("execute_request content.code must be a string")
            handle = self.gateway.submit(self.tenant, self.session, code, None)
        except (GatewayError, KernelPoolError) as exc:
            await self._fail(request, type(exc).__name__, str(exc))
            return False
        count = self.session.execution_count + self.session.pending  # the kernel's next count
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
                await self._emit(output_message(error, parent=parent, session=self.key,
                                                execution_count=count))
            elif done.reason and (done.status != ExecutionStatus.INTERRUPTED or done.restarted):
                await self._send(request, "iopub", "stream",
                                 {"name": "stderr", "text": f"[replgate] {done.reason}\n"})
        await self._reply(request, "execute_reply", execute_reply(done, error, count))
        await self._status(request, "idle")
        return done.status == ExecutionStatus.OK
