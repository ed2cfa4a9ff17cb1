"""envd's ``process.Process`` service on replgate's shell commands (``Gateway.run_command``).

E2B's ``commands.run(cmd)`` starts ``/bin/bash -l -c CMD``; replgate runs that command line
(without ``-l``: a login shell's profile would reset the sandbox's PATH) beside the kernel,
under the sandbox's limits, in the workspace (or the ``cwd`` asked for, ``/`` too). Output
streams as ``data`` events, the exit as ``end`` (the SDK raises ``CommandExitException`` on a
non-zero code). Each command gets a pid by which ``SendSignal`` (SIGKILL, SIGTERM), ``List``
and ``Connect`` find it; on many machines ``SendSignal``, ``SendInput``, ``CloseStdin``,
``StreamInput`` and ``Update`` reach one started through another gateway too (``List`` and
``Connect`` know those started through their own).

A command started with ``stdin`` takes input (``SendInput``, ``StreamInput``) until
``CloseStdin``; one started with a ``pty`` runs on a terminal of that size (E2B's
``sandbox.pty``: ``/bin/bash -i``), its output as ``data.pty``, resized by ``Update``.

As in E2B, a command outlives the stream that started it (``disconnect``, then ``connect`` by
pid); it is bounded by its ``timeout`` (the stream's deadline) or, with ``timeout=0``, by the
profile's maximum. A sandbox killed while a command runs ends its streams with ``UNAVAILABLE``,
after which the SDK asks the sandbox's health and raises "sandbox was killed". Not offered:
signals other than SIGKILL and SIGTERM.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import logging
import posixpath
import secrets
import shlex
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from pydantic import ValidationError

from gateway.e2b._connect import (
    TARGET,
    ConnectService,
    Empty,
    Target,
    server_stream,
    unary,
)
from gateway.e2b._errors import E2BError
from gateway.e2b._paths import HOME, to_workspace
from gateway.e2b._process_input import SERVICE, ProcessInputs, client_stream
from gateway.e2b._process_models import (
    CloseStdinRequest,
    ConnectRequest,
    DataEvent,
    EndEvent,
    EventResponse,
    ListResponse,
    ProcessConfig,
    ProcessEvent,
    ProcessInfo,
    ProcessSelector,
    SendInputRequest,
    SignalRequest,
    StartEvent,
    StartRequest,
    UpdateRequest,
)
from gateway.errors import GatewayError, status_for
from gateway.wire import CommandRequest
from kernel_pool import (
    CommandResult,
    CommandStatus,
    KernelPoolError,
    PtySize,
    SessionClosed,
    StreamEvent,
)

logger = logging.getLogger(__name__)

KEEPALIVE_S = 50.0
"""How long a stream may stay silent before a keepalive event (E2B's SDKs ask for 50 s)."""
FOLLOWER_EVENTS = 1024
"""Events a stream may fall behind its terminal before it is ended."""

_CODES = {400: Code.INVALID_ARGUMENT, 404: Code.NOT_FOUND, 409: Code.ALREADY_EXISTS,
          413: Code.INVALID_ARGUMENT, 429: Code.RESOURCE_EXHAUSTED,
          507: Code.RESOURCE_EXHAUSTED}
_STOPPING = {"SIGNAL_SIGKILL", "SIGNAL_SIGTERM", "9", "15"}


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
    pty: bool = False
    streams: set[asyncio.Queue[Said]] = field(default_factory=set)
    task: asyncio.Task[None] | None = None
    started: bool = False
    """Running where the session is: a kill by its pid (through any gateway) reaches it."""

    def start(self) -> None:
        self.started = True
        self.tell(ProcessEvent(start=StartEvent(pid=self.pid)))

    def follower(self) -> asyncio.Queue[Said]:
        """A new stream's queue: bounded for a terminal, whose output is not capped (a
        command's caps bound its events)."""
        queue: asyncio.Queue[Said] = asyncio.Queue(FOLLOWER_EVENTS if self.pty else 0)
        self.streams.add(queue)
        return queue

    def tell(self, said: Said) -> None:
        for queue in list(self.streams):
            try:
                queue.put_nowait(said)
            except asyncio.QueueFull:  # a terminal's output is not capped: its reader lags
                self.streams.discard(queue)
                queue.get_nowait()
                queue.put_nowait(ConnectError(
                    Code.ABORTED, f"this stream fell too far behind the output of "
                    f"process {self.pid}; connect to it again"))


def _command_id(pid: int) -> str:
    """The id of the command E2B knows by ``pid`` (on the session's node too)."""
    return f"e2b-{pid}"


def _command_line(config: ProcessConfig) -> str:
    args = config.args
    if config.cmd.rsplit("/", 1)[-1] in ("bash", "sh"):
        args = [arg for arg in args if arg != "-l"]
    return shlex.join([config.cmd, *args])


def _cwd(cwd: str | None) -> str | None:
    """The command's folder: in the workspace as a workspace path, elsewhere absolute (the
    sandbox's own folders, ``/`` too); a relative one is from ``/home/user``."""
    if not cwd:
        return None
    if "\x00" in cwd:
        raise E2BError(400, "cwd cannot contain a NUL character")
    if cwd.startswith("~"):
        cwd = HOME + cwd[1:]
    absolute = posixpath.normpath(posixpath.join(HOME, cwd))
    if absolute == HOME or absolute.startswith(HOME + "/"):
        return to_workspace(absolute)
    return "/" + absolute.lstrip("/")


def _data(event: StreamEvent, pty: bool) -> ProcessEvent:
    encoded = base64.b64encode(event.text.encode("utf-8")).decode()
    if pty:
        return ProcessEvent(data=DataEvent(pty=encoded))
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


class Processes(ProcessInputs):
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
                lambda event: running.tell(_data(event, running.pty)), running.start)
            said = _end(result)
        except SessionClosed:
            # Not the sandbox's "was not found": the SDK then asks the sandbox's health (from
            # 2.63; older releases raise their TimeoutException with this text as it is, so it
            # says what the newer ones say).
            said = ConnectError(Code.UNAVAILABLE, "sandbox was killed or reached its end of "
                                                  "life while the command ran (sandbox "
                                                  f"{target.session.id})")
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
        config = request.process
        if not config.cmd:
            raise ConnectError(Code.INVALID_ARGUMENT, "process.cmd is empty; name the program "
                                                      "to run, e.g. /bin/bash with args -c CMD")
        deadline_ms = ctx.timeout_ms
        limit = target.session.profile.max_timeout_s
        pid = next(self._pids)
        try:
            size = request.pty.size if request.pty is not None else None
            command = CommandRequest(
                cmd=_command_line(config), env=config.envs, cwd=_cwd(config.cwd),
                id=_command_id(pid), stdin=bool(request.stdin),
                pty=None if request.pty is None else PtySize(
                    cols=size.cols if size else 80, rows=size.rows if size else 24),
                timeout_s=min(limit, deadline_ms / 1000) if deadline_ms else limit)
        except E2BError as exc:
            raise ConnectError(Code.INVALID_ARGUMENT, exc.message) from None
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            raise ConnectError(Code.INVALID_ARGUMENT, f"{where}: {first['msg']}") from None
        running = Running(pid, command.id or "", config, request.tag, command.pty is not None)
        queue = running.follower()
        self._running.setdefault(target.session.id, {})[pid] = running
        running.task = asyncio.create_task(self._run(target, command, running))
        return _follow(running, queue, ctx)

    def connect(self, request: ConnectRequest, ctx: RequestContext[Any, Any],
                ) -> AsyncIterator[EventResponse]:
        running = self._find(TARGET.get().session.id, request.process)
        return _follow(running, running.follower(), ctx)

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

    def _command_of(self, session_id: str, selector: ProcessSelector) -> str:
        """The command id of the selected process; by its pid, one started through another
        gateway too (the session's node knows it)."""
        try:
            return self._find(session_id, selector).command_id
        except ConnectError:
            if selector.pid is None:
                raise
            return _command_id(selector.pid)

    def service(self) -> ConnectService:
        return ConnectService(SERVICE, dict([
            server_stream(SERVICE, "Start", StartRequest, EventResponse, self.start),
            server_stream(SERVICE, "Connect", ConnectRequest, EventResponse, self.connect),
            unary(SERVICE, "List", Empty, ListResponse, self.list),
            unary(SERVICE, "SendSignal", SignalRequest, Empty, self.send_signal),
            unary(SERVICE, "Update", UpdateRequest, Empty, self.update),
            unary(SERVICE, "SendInput", SendInputRequest, Empty, self.send_input),
            unary(SERVICE, "CloseStdin", CloseStdinRequest, Empty, self.close_stdin),
            client_stream("StreamInput", self.stream_input),
        ]))


def process_service() -> ConnectService:
    """envd's process service for one app (its commands' pids live as long as the app)."""
    return Processes().service()
