"""envd's ``process.Process`` service on replgate's shell commands (``Gateway.run_command``).

E2B's ``commands.run(cmd)`` starts ``/bin/bash -l -c CMD``; replgate runs that command line
(without ``-l``: a login shell's profile would reset the sandbox's PATH) beside the kernel,
under the sandbox's limits, in the workspace (``cwd`` under ``/home/user``). Output streams as
``data`` events, the exit as ``end`` (the SDK raises ``CommandExitException`` on a non-zero
code). Each command gets a pid by which ``SendSignal`` (SIGKILL, SIGTERM), ``List`` and
``Connect`` find it; on many machines ``SendSignal`` reaches one started through another
gateway too (``List`` and ``Connect`` know those started through their own).

As in E2B, a command outlives the stream that started it (``disconnect``, then ``connect`` by
pid); it is bounded by its ``timeout`` (the stream's deadline) or, with ``timeout=0``, by the
profile's maximum. Not offered: terminals (pty), stdin, other signals.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import logging
import secrets
import shlex
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.method import IdempotencyLevel, MethodInfo
from connectrpc.request import RequestContext
from connectrpc.server import Endpoint
from pydantic import Field, ValidationError

from gateway.e2b._connect import (
    TARGET,
    ConnectService,
    Empty,
    ProtoJSON,
    Target,
    not_offered,
    server_stream,
    unary,
)
from gateway.e2b._errors import E2BError
from gateway.e2b._paths import to_workspace
from gateway.errors import GatewayError, status_for
from gateway.wire import CommandRequest
from kernel_pool import CommandResult, CommandStatus, KernelPoolError, StreamEvent

logger = logging.getLogger(__name__)

SERVICE = "process.Process"
KEEPALIVE_S = 50.0
"""How long a stream may stay silent before a keepalive event (E2B's SDKs ask for 50 s)."""

_CODES = {400: Code.INVALID_ARGUMENT, 404: Code.NOT_FOUND, 409: Code.ALREADY_EXISTS,
          413: Code.INVALID_ARGUMENT, 429: Code.RESOURCE_EXHAUSTED,
          507: Code.RESOURCE_EXHAUSTED}
_STOPPING = {"SIGNAL_SIGKILL", "SIGNAL_SIGTERM", "9", "15"}


class ProcessConfig(ProtoJSON):
    cmd: str = ""
    args: list[str] = Field(default_factory=list)
    envs: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None


class ProcessSelector(ProtoJSON):
    pid: int | None = None
    tag: str | None = None


class StartRequest(ProtoJSON):
    process: ProcessConfig = ProcessConfig()
    pty: dict[str, Any] | None = None
    tag: str | None = None
    stdin: bool | None = None


class ConnectRequest(ProtoJSON):
    process: ProcessSelector = ProcessSelector()


class SignalRequest(ProtoJSON):
    process: ProcessSelector = ProcessSelector()
    signal: str | int = "SIGNAL_UNSPECIFIED"


class StartEvent(ProtoJSON):
    pid: int


class DataEvent(ProtoJSON):
    """One chunk of output; ``bytes`` fields are base64 in ProtoJSON."""

    stdout: str | None = None
    stderr: str | None = None


class EndEvent(ProtoJSON):
    exit_code: int
    exited: bool
    status: str
    error: str | None = None


class ProcessEvent(ProtoJSON):
    start: StartEvent | None = None
    data: DataEvent | None = None
    end: EndEvent | None = None
    keepalive: Empty | None = None


class EventResponse(ProtoJSON):
    """``StartResponse`` and ``ConnectResponse`` alike."""

    event: ProcessEvent


class ProcessInfo(ProtoJSON):
    config: ProcessConfig
    pid: int
    tag: str | None = None


class ListResponse(ProtoJSON):
    processes: list[ProcessInfo]


Said = ProcessEvent | ConnectError
"""What a command tells its streams: an event, or the error that ends them."""


@dataclass
class Running:
    """A command started through E2B, by the pid E2B knows it by, and the streams following
    it (its ``Start`` and any ``Connect``)."""

    pid: int
    command_id: str
    config: ProcessConfig
    tag: str | None
    streams: set[asyncio.Queue[Said]] = field(default_factory=set)
    task: asyncio.Task[None] | None = None
    started: bool = False
    """Running where the session is: a kill by its pid (through any gateway) reaches it."""

    def start(self) -> None:
        self.started = True
        self.tell(ProcessEvent(start=StartEvent(pid=self.pid)))

    def tell(self, said: Said) -> None:
        for queue in self.streams:
            queue.put_nowait(said)


def _command_id(pid: int) -> str:
    """The id of the command E2B knows by ``pid`` (on the session's node too)."""
    return f"e2b-{pid}"


def _command_line(config: ProcessConfig) -> str:
    args = config.args
    if config.cmd.rsplit("/", 1)[-1] in ("bash", "sh"):
        args = [arg for arg in args if arg != "-l"]
    return shlex.join([config.cmd, *args])


def _data(event: StreamEvent) -> ProcessEvent:
    encoded = base64.b64encode(event.text.encode("utf-8")).decode()
    data = DataEvent(stdout=encoded) if event.type == "stdout" else DataEvent(stderr=encoded)
    return ProcessEvent(data=data)


def _end(result: CommandResult) -> Said:
    if result.status is CommandStatus.TIMEOUT:
        return ConnectError(Code.DEADLINE_EXCEEDED, result.reason or "the command timed out")
    if result.status is CommandStatus.KILLED or result.exit_code is None:
        return ProcessEvent(end=EndEvent(exit_code=-1, exited=False, status="signal: killed",
                                         error=result.reason or "signal: killed"))
    return ProcessEvent(end=EndEvent(exit_code=result.exit_code, exited=True,
                                     status=f"exit status {result.exit_code}"))


def _keepalive_s(ctx: RequestContext[Any, Any]) -> float:
    try:
        return max(1.0, float(ctx.request_headers.get("keepalive-ping-interval", KEEPALIVE_S)))
    except ValueError:
        return KEEPALIVE_S


async def _follow(running: Running, queue: asyncio.Queue[Said],
                  ctx: RequestContext[Any, Any]) -> AsyncIterator[EventResponse]:
    """The stream of one follower: the start event (once the command runs, so that its pid
    can be killed), then what the command says to its end."""
    keepalive = _keepalive_s(ctx)
    try:
        if running.started:
            yield EventResponse(event=ProcessEvent(start=StartEvent(pid=running.pid)))
        while True:
            try:
                said = await asyncio.wait_for(queue.get(), keepalive)
            except TimeoutError:
                yield EventResponse(event=ProcessEvent(keepalive=Empty()))
                continue
            if isinstance(said, ConnectError):
                raise said
            yield EventResponse(event=said)
            if said.end is not None:
                return
    finally:
        running.streams.discard(queue)


class Processes:
    """The service, with the commands it started: per session, by pid."""

    def __init__(self) -> None:
        # Each gateway counts from its own random start: a command started through one is
        # killed through another by the id its pid makes (on many machines).
        self._pids = itertools.count(1000 + secrets.randbelow(1 << 20) * 1000)
        self._running: dict[str, dict[int, Running]] = {}

    def _of(self, session_id: str) -> dict[int, Running]:
        return self._running.get(session_id, {})

    def _find(self, session_id: str, selector: ProcessSelector) -> Running:
        for running in self._of(session_id).values():
            if running.pid == selector.pid or (selector.tag is not None
                                               and running.tag == selector.tag):
                return running
        wanted = selector.model_dump(exclude_none=True) or "no pid or tag"
        raise ConnectError(Code.NOT_FOUND, f"no running command with {wanted}")

    async def _run(self, target: Target, command: CommandRequest, running: Running) -> None:
        said: Said
        try:
            result = await target.gateway.run_command(
                target.tenant, target.session, command,
                lambda event: running.tell(_data(event)), running.start)
            said = _end(result)
        except (GatewayError, KernelPoolError) as exc:
            said = ConnectError(_CODES.get(status_for(exc), Code.UNAVAILABLE), str(exc))
        except Exception as exc:  # a fault of ours: its streams must still end
            logger.exception("E2B command %s failed", running.command_id)
            said = ConnectError(Code.INTERNAL, f"internal error: {exc!r}")
        finally:
            commands = self._of(target.session.id)
            commands.pop(running.pid, None)
            if not commands:
                self._running.pop(target.session.id, None)
        running.tell(said)

    def start(self, request: StartRequest, ctx: RequestContext[Any, Any],
              ) -> AsyncIterator[EventResponse]:
        target = TARGET.get()
        if request.pty is not None:
            raise not_offered("terminals (pty); run the command without one")
        if request.stdin:
            raise not_offered("stdin to commands; pass the input in the command itself")
        config = request.process
        if not config.cmd:
            raise ConnectError(Code.INVALID_ARGUMENT, "process.cmd is empty; name the program "
                                                      "to run, e.g. /bin/bash with args -c CMD")
        deadline_ms = ctx.timeout_ms
        limit = target.session.profile.max_timeout_s
        pid = next(self._pids)
        try:
            cwd = to_workspace(config.cwd) if config.cwd else None
            command = CommandRequest(
                cmd=_command_line(config), env=config.envs, cwd=cwd, id=_command_id(pid),
                timeout_s=min(limit, deadline_ms / 1000) if deadline_ms else limit)
        except E2BError as exc:
            raise ConnectError(Code.INVALID_ARGUMENT, exc.message) from None
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            raise ConnectError(Code.INVALID_ARGUMENT, f"{where}: {first['msg']}") from None
        running = Running(pid, command.id or "", config, request.tag)
        queue: asyncio.Queue[Said] = asyncio.Queue()
        running.streams.add(queue)
        self._running.setdefault(target.session.id, {})[pid] = running
        running.task = asyncio.create_task(self._run(target, command, running))
        return _follow(running, queue, ctx)

    def connect(self, request: ConnectRequest, ctx: RequestContext[Any, Any],
                ) -> AsyncIterator[EventResponse]:
        running = self._find(TARGET.get().session.id, request.process)
        queue: asyncio.Queue[Said] = asyncio.Queue()
        running.streams.add(queue)
        return _follow(running, queue, ctx)

    async def list(self, request: Empty) -> ListResponse:
        return ListResponse(processes=[
            ProcessInfo(config=r.config, pid=r.pid, tag=r.tag)
            for r in self._of(TARGET.get().session.id).values()])

    async def send_signal(self, request: SignalRequest) -> Empty:
        target = TARGET.get()
        try:
            command_id, here = self._find(target.session.id, request.process).command_id, True
        except ConnectError:
            if request.process.pid is None:
                raise
            # Perhaps started through another gateway: the session's node knows its id.
            command_id, here = _command_id(request.process.pid), False
        if str(request.signal) not in _STOPPING:
            raise ConnectError(Code.INVALID_ARGUMENT,
                               f"replgate does not send {request.signal} to commands; it stops "
                               "them with SIGKILL or SIGTERM only")
        killed = False
        with contextlib.suppress(KernelPoolError):  # ended meanwhile: nothing left to stop
            killed = await target.gateway.kill_command(target.session, command_id)
        if not (here or killed):
            raise ConnectError(Code.NOT_FOUND,
                               f"no running command with pid {request.process.pid}")
        return Empty()

    def service(self) -> ConnectService:
        return ConnectService(SERVICE, dict([
            server_stream(SERVICE, "Start", StartRequest, EventResponse, self.start),
            server_stream(SERVICE, "Connect", ConnectRequest, EventResponse, self.connect),
            unary(SERVICE, "List", Empty, ListResponse, self.list),
            unary(SERVICE, "SendSignal", SignalRequest, Empty, self.send_signal),
            unary(SERVICE, "Update", Empty, Empty, _no_pty),
            unary(SERVICE, "SendInput", Empty, Empty, _no_stdin),
            unary(SERVICE, "CloseStdin", Empty, Empty, _no_stdin),
            _client_stream("StreamInput"),
        ]))


async def _no_pty(request: Empty) -> Empty:
    raise not_offered("terminals (pty); run commands without one")


async def _no_stdin(request: Empty) -> Empty:
    raise not_offered("stdin to commands; pass the input in the command itself")


def _client_stream(name: str) -> tuple[str, Endpoint[Empty, Empty]]:
    async def refuse(_messages: AsyncIterator[Empty], _ctx: RequestContext[Empty, Empty],
                     ) -> Empty:
        raise not_offered("stdin to commands; pass the input in the command itself")

    info = MethodInfo(name=name, service_name=SERVICE, input=Empty, output=Empty,
                      idempotency_level=IdempotencyLevel.UNKNOWN)
    return f"/{SERVICE}/{name}", Endpoint.client_stream(method=info, function=refuse)


def process_service() -> ConnectService:
    """envd's process service for one app (its commands' pids live as long as the app)."""
    return Processes().service()
