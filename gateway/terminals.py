"""Terminals: commands run on a pty for interactive use, which clients attach to and leave.

A terminal is a shell command of the session (``Gateway.run_command`` with a ``pty``: the
same limits, timeout, audit record and reaping as any command), bounded by the profile's
maximum command time. It outlives the socket that started it: a client that goes away leaves
it running, and one that comes back with its id attaches again and is sent the last output
first (:data:`SCROLLBACK_CHARS`), so that its screen is drawn again. Terminals are known to the
gateway that started them; their input and kill reach them through any gateway (they are the
session's commands, by id).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import deque
from dataclasses import dataclass, field

from gateway.errors import DOMAIN_ERRORS
from gateway.service import Gateway
from gateway.wire import (
    CommandRequest,
    StreamEvent,
    TerminalExit,
    TerminalOutput,
    TerminalStarted,
)
from kernel_pool import CommandNotFound, PtySize, SessionPort

logger = logging.getLogger(__name__)

DEFAULT_COMMAND = "exec bash -i"
"""What a terminal runs unless told: an interactive shell, without a login's profile."""
SCROLLBACK_CHARS = 64 * 1024
"""The output kept to draw an attaching client's screen again."""
LISTENER_FRAMES = 256
"""Frames a client may fall behind before it is detached (it may attach again)."""

TerminalFrame = TerminalStarted | TerminalOutput | TerminalExit


@dataclass(eq=False)
class Listener:
    """One attached client: the frames to send it; ``None`` once it is detached for lagging."""

    frames: asyncio.Queue[TerminalFrame | None] = field(
        default_factory=lambda: asyncio.Queue(LISTENER_FRAMES))
    lagged: bool = False


@dataclass(eq=False)
class Terminal:
    """A running terminal and the clients attached to it."""

    id: str
    session_id: str
    tenant: str
    scrollback: deque[str] = field(default_factory=deque)
    kept: int = 0
    listeners: set[Listener] = field(default_factory=set)
    task: asyncio.Task[None] | None = None
    ended: TerminalExit | None = None

    def output(self, event: StreamEvent) -> None:
        self.scrollback.append(event.text)
        self.kept += len(event.text)
        while self.kept - len(self.scrollback[0]) >= SCROLLBACK_CHARS:
            self.kept -= len(self.scrollback.popleft())
        self.tell(TerminalOutput(data=event.text))

    def tell(self, frame: TerminalFrame) -> None:
        for listener in list(self.listeners):
            try:
                listener.frames.put_nowait(frame)
            except asyncio.QueueFull:
                listener.lagged = True
                self.listeners.discard(listener)
                with contextlib.suppress(asyncio.QueueEmpty):
                    listener.frames.get_nowait()  # room for the end of its stream
                listener.frames.put_nowait(None)

    def attach(self) -> Listener:
        """A new client, sent the started frame and the output kept so far."""
        listener = Listener()
        listener.frames.put_nowait(TerminalStarted(id=self.id))
        if self.scrollback:
            listener.frames.put_nowait(TerminalOutput(data="".join(self.scrollback)))
        if self.ended is not None:
            listener.frames.put_nowait(self.ended)
        else:
            self.listeners.add(listener)
        return listener

    def detach(self, listener: Listener) -> None:
        self.listeners.discard(listener)


class Terminals:
    """The terminals this gateway started, by id."""

    def __init__(self) -> None:
        self._running: dict[str, Terminal] = {}

    def __repr__(self) -> str:
        return f"<Terminals {len(self._running)} running>"

    async def start(self, gateway: Gateway, tenant: str, session: SessionPort, command: str,
                    size: PtySize) -> Terminal:
        """Start a terminal running ``command``; it returns once the command runs (its
        refusal, e.g. too many commands, is raised)."""
        terminal = Terminal(id=f"term-{uuid.uuid4().hex}", session_id=session.id,
                            tenant=tenant)
        request = CommandRequest(cmd=command, id=terminal.id, pty=size,
                                 timeout_s=session.profile.max_timeout_s)
        started = asyncio.Event()
        terminal.task = asyncio.create_task(
            self._run(gateway, tenant, session, request, terminal, started))
        self._running[terminal.id] = terminal
        waiting = asyncio.ensure_future(started.wait())
        try:
            await asyncio.wait({terminal.task, waiting}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
        if not started.is_set():
            terminal.task.result()  # its refusal
        return terminal

    async def _run(self, gateway: Gateway, tenant: str, session: SessionPort,
                   request: CommandRequest, terminal: Terminal, started: asyncio.Event) -> None:
        try:
            result = await gateway.run_command(tenant, session, request, terminal.output,
                                               started.set)
            terminal.ended = TerminalExit(exit_code=result.exit_code, status=result.status)
        except DOMAIN_ERRORS as exc:
            terminal.ended = TerminalExit(exit_code=None, status="error")
            if not started.is_set():
                raise
            logger.info("terminal %s ended: %s", terminal.id, exc)
        finally:
            self._running.pop(terminal.id, None)
            if terminal.ended is None:  # cancelled, or a fault of ours
                terminal.ended = TerminalExit(exit_code=None, status="error")
            terminal.tell(terminal.ended)

    def find(self, tenant: str, session_id: str, terminal_id: str) -> Terminal:
        """A running terminal of the tenant's session; :class:`CommandNotFound` else."""
        terminal = self._running.get(terminal_id)
        if terminal is None or (terminal.tenant, terminal.session_id) != (tenant, session_id):
            raise CommandNotFound(session_id, terminal_id)
        return terminal
