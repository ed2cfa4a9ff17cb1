"""The execution engine: one piece of code on one kernel, from request to ``done``.

It sends ``execute_request``, turns the kernel's messages into typed events, applies the output
caps, and enforces the time limit for real: at ``timeout_s`` it interrupts; if the kernel is
not back within the grace period it kills every process in the sandbox and starts a fresh
kernel on the same workspace. A kernel that dies mid-execution (crash, out of memory, container
gone) ends the execution as ``died`` and is restarted. The session stays usable either way.
When it ends, the processes it left detached (daemons) are killed; after a timeout or an
interrupt, every process but the kernel is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernel_pool._caps import SPILL_DIR, OutputLimiter, spill
from kernel_pool._channel_watch import STALL_S
from kernel_pool._channels import KernelDied, KernelState
from kernel_pool._kernel import Kernel
from kernel_pool._lines import LineJoiner
from kernel_pool._results import files_from_reply
from kernel_pool._translate import translate
from kernel_pool.backends.base import CgroupUsage
from kernel_pool.config import OutputCaps
from kernel_pool.events import (
    ClearOutputEvent,
    DisplayEvent,
    DoneEvent,
    ErrorEvent,
    ExecutionStatus,
    FileChange,
    OutputEvent,
    ResourceUsage,
    StreamEvent,
    UpdateDisplayEvent,
)
from kernel_pool.exceptions import KernelPoolError

logger = logging.getLogger(__name__)
STOPPED = (ExecutionStatus.INTERRUPTED, ExecutionStatus.TIMEOUT)
"""An execution its kernel was asked to stop (an interrupt was sent)."""
MARKER_POLL_S = 0.005
"""While waiting for a late-output marker, how often the execution's own queue is drained."""

Emit = Callable[[OutputEvent], None]


@dataclass(frozen=True)
class LateOutput:
    """How to take the output a kernel may still send after its ``idle``.

    ``code(marker)``, run silently after the execution, prints ``marker`` behind everything the
    execution printed (the kernel's output keeps its order): once the marker came, the output is
    whole. Without it within ``wait_s`` (the code failed, or the user's code replaced the
    printing function), the output is taken until it has been quiet ``quiet_s``.
    """

    code: Callable[[str], str]
    wait_s: float
    quiet_s: float


class ExecutionRun:
    """Runs one piece of code; :meth:`run` emits its events and returns the ``done`` event."""

    def __init__(self, kernel: Kernel, code: str, *, timeout_s: float, caps: OutputCaps,
                 execution_id: str, interrupt_grace_s: float,
                 restarted_before: str | None = None,
                 late_output: LateOutput | None = None) -> None:
        self.kernel = kernel
        self.code = code
        self.timeout_s = timeout_s
        self.execution_id = execution_id
        self.interrupt_grace_s = interrupt_grace_s
        self.limiter = OutputLimiter(caps, f"{SPILL_DIR}/{execution_id}.txt")
        self._route: asyncio.Queue[tuple[str, Any]] | None = None
        self._status: ExecutionStatus | None = None
        self._usage_before_restart: CgroupUsage | None = None
        self._interrupt_requested = False
        self._errors = 0
        """Error outputs the kernel sent: with any, the status is ``error`` (a display
        formatter that raised leaves the reply ``ok``)."""
        self._lines = LineJoiner()
        self._restart_reason = restarted_before
        """Why the kernel was restarted before this execution (it then says so)."""
        self.late_output = late_output
        """For a kernel whose output may still come after its ``idle`` (Deno's sends its
        console output from a task of its own, after it at times): how to know it is whole."""
        self.sent_ns: int | None = None
        """When ``execute_request`` went to the kernel (``time.time_ns()``, for traces)."""
        self.idle_ns: int | None = None
        """When the kernel was idle again, its reply and output in (or the run otherwise
        ended: a timeout, a death)."""

    def interrupt(self) -> bool:
        """Ask for the run to stop (status ``interrupted``); False if it is not running."""
        if self._route is None or self._status is not None:
            return False
        self._interrupt_requested = True
        # Only a wake-up: the loop checks the flag before each message, so a queue full of
        # output (a flood) delays nothing.
        with contextlib.suppress(asyncio.QueueFull):
            self._route.put_nowait(("interrupt", None))
        return True

    async def run(self, emit: Emit) -> DoneEvent:
        started = time.monotonic()
        broken = await self.kernel.channel_ready()
        if broken is not None and self.kernel.death is None:
            # The output channel could not be re-established after it broke: a fresh kernel
            # is the only way to have this execution's output arrive whole.
            self._usage_before_restart = await self.kernel.sandbox.usage()
            await self.kernel.restart()
            self._restart_reason = (f"{broken}; a fresh kernel was started before this "
                                    "execution (variables lost, files kept)")
        msg_id, route = self.kernel.request("execute_request", {
            "code": self.code, "silent": False, "store_history": True, "user_expressions": {},
            "allow_stdin": False, "stop_on_error": True})
        self.sent_ns = time.time_ns()
        self._route = route
        try:
            # Read after sending: the readings overlap the message's way to the kernel instead
            # of delaying it (the kernel cannot have run the code in these microseconds).
            before = await self.kernel.sandbox.usage()
            peak_reset = await self.kernel.sandbox.reset_peak_memory()
            done = await self._loop(route, emit, started)
            self.idle_ns = time.time_ns()
        finally:
            self.kernel.forget(msg_id)
            self._route = None
        for piece in self._lines.flush():
            self._emit_stream(piece, emit)
        if self._restart_reason is not None and not done.restarted:
            done.restarted = True
            done.reason = "; ".join(filter(None, [self._restart_reason, done.reason]))
        if not done.restarted and self.kernel.state == KernelState.READY:
            # No daemon outlives the execution that made it; after a timeout or an interrupt
            # nothing but the kernel does (its children are what did not stop).
            cut = done.status in STOPPED
            done.reaped = await self.kernel.sandbox.kill_strays(keep_kernel_children=not cut)
            if done.reaped:
                logger.info("execution %s: killed %d process(es) it left behind",
                            self.execution_id, done.reaped)
        await self._spill(final=True)
        for event in self.limiter.finish():
            emit(event)
        # After a restart the cgroup may be a new container's: use the reading taken before it.
        after = self._usage_before_restart or await self.kernel.sandbox.usage()
        done.truncated = self.limiter.truncated
        done.duration_ms = round((time.monotonic() - started) * 1000, 3)
        done.metrics = ResourceUsage(
            cpu_time_ms=(after.cpu_ns - before.cpu_ns) / 1e6
            if after.cpu_ns is not None and before.cpu_ns is not None else None,
            peak_memory_bytes=after.peak_memory_bytes if peak_reset else None)
        return done

    async def _loop(self, route: asyncio.Queue[tuple[str, Any]], emit: Emit,
                    started: float) -> DoneEvent:
        loop = asyncio.get_running_loop()
        deadline = started + self.timeout_s
        deadline_loop = loop.time() + (deadline - time.monotonic())
        breaks = self.kernel.channel_breaks
        reply: dict[str, Any] | None = None
        files: list[FileChange] = []
        files_cut = False
        idle = False
        reason: str | None = None
        while reply is None or not idle:
            # Death, interrupt and deadline are checked before every message, not only when
            # the queue runs dry: under a flood of output it may never do so.
            if self.kernel.death is not None:
                return await self._recover_death(self.kernel.death)
            if reply is not None and self.kernel.channel_breaks != breaks:
                break  # its idle status may have been lost with the channel: do not wait for it
            if self._interrupt_requested and self._status is None:
                self._status = ExecutionStatus.INTERRUPTED
                reason = "interrupted on request"
                self.kernel.interrupt()
                deadline_loop = loop.time() + self.interrupt_grace_s
            if loop.time() >= deadline_loop:
                if reply is not None:
                    # The reply came but the output channel stayed silent, its idle status
                    # never came: output may be lost. Subscribe afresh; not ``ok``.
                    self.kernel.recover_channel(
                        f"the kernel's output channel stalled (no end of output within "
                        f"{STALL_S:g}s of the reply)")
                    break
                if self._status is None:
                    self._status = ExecutionStatus.TIMEOUT
                    reason = f"execution exceeded timeout_s={self.timeout_s:g}"
                    self.kernel.interrupt()
                    deadline_loop = loop.time() + self.interrupt_grace_s
                    continue
                return await self._hard_restart(reason or "the kernel did not stop")
            wake = deadline_loop if self._lines.deadline is None else min(deadline_loop,
                                                                         self._lines.deadline)
            try:
                async with asyncio.timeout_at(wake):
                    channel, msg = await route.get()
            except TimeoutError:
                if self._lines.deadline is not None and loop.time() >= self._lines.deadline:
                    for piece in self._lines.flush():
                        self._emit_stream(piece, emit)
                continue
            if channel in ("interrupt", "died", "channel"):
                continue  # wake-ups; the checks above act on them
            if channel == "shell":
                if msg.get("msg_type") == "execute_reply":
                    reply = msg.get("content") if isinstance(msg.get("content"), dict) else {}
                    files, files_cut = files_from_reply(msg.get("metadata"))
                    if not idle:
                        # outputs still in flight on iopub: a wait for its idle status
                        deadline_loop = min(deadline_loop, loop.time() + STALL_S)
                continue
            if reply is not None:  # output still arrives: the channel is alive, wait on
                deadline_loop = max(deadline_loop, loop.time() + STALL_S)
            if msg.get("msg_type") == "status":
                content = msg.get("content") or {}
                idle = isinstance(content, dict) and content.get("execution_state") == "idle"
                continue
            event = translate(msg)
            if event is not None:
                self._emit(event, emit)
                await self._spill()
        assert reply is not None
        if idle and self.late_output is not None:
            answered = await self._late_output(self.late_output, route, emit, deadline_loop)
            if not answered and self._status in STOPPED:
                # Deno's interrupt (V8's terminate; a timeout's too) can leave its REPL thread
                # answering nothing more: the next execution would hang to its timeout. Seen
                # by the marker's code, which got no reply either.
                return await self._hard_restart(
                    reason or "interrupted", "the kernel answered nothing after the interrupt")
        count = reply.get("execution_count")
        status = self._status
        if self.kernel.channel_breaks != breaks:
            return await self._channel_lost(count if isinstance(count, int) else None, emit)
        if status is None:
            status = (ExecutionStatus.OK if reply.get("status") == "ok" and not self._errors
                      else ExecutionStatus.ERROR)
        if files_cut:
            self.limiter.truncated = True
        return DoneEvent(status=status, execution_count=count if isinstance(count, int) else None,
                         duration_ms=0.0, reason=reason, files=files)

    async def _late_output(self, late: LateOutput, route: asyncio.Queue[tuple[str, Any]],
                           emit: Emit, deadline: float) -> bool:
        """Take the output that follows ``idle``: up to ``late``'s marker, else until it has
        been quiet ``late.quiet_s`` (or the execution's time is up). Whether the kernel
        answered the marker's code at all.

        After an interrupt (or a timeout's) the marker is waited for its whole ``wait_s``
        (the execution's own deadline is then the short grace): its silence is the news that
        the kernel hangs.
        """
        loop = asyncio.get_running_loop()
        stopped = self._status in STOPPED
        wait = loop.time() + late.wait_s
        came, answered = await self._until_marker(
            late, route, emit, wait if stopped else min(deadline, wait), stopped)
        if came:
            return True
        while loop.time() < deadline and not self._interrupt_requested:
            try:
                async with asyncio.timeout_at(min(deadline, loop.time() + late.quiet_s)):
                    channel, msg = await route.get()
            except TimeoutError:
                break
            await self._take_late(channel, msg, emit)
        return answered

    async def _until_marker(self, late: LateOutput, route: asyncio.Queue[tuple[str, Any]],
                            emit: Emit, deadline: float, stopped: bool,
                            ) -> tuple[bool, bool]:
        """Run ``late``'s code and take the output until its marker: whether it came, and
        whether anything at all came under the marker's request. A ``stopped`` execution
        (interrupted, or at its timeout) waits for them to its deadline; another stops waiting
        at an interrupt.

        The kernel sends output under the request it runs last: what this execution printed
        late comes under its own request, then under the marker's (a wait on the marker's
        queue drains this one first, whose messages all came before). The marker's reply is
        waited for too: Deno's kernel, sent the next execution before it had replied to the
        marker, now and then never answered that execution (1 in 10 runs of three executions
        queued at once; none in 60 since).
        """
        loop = asyncio.get_running_loop()
        marker = f"replgate-output-end-{secrets.token_hex(8)}"
        msg_id, marked = self.kernel.request("execute_request", {
            "code": late.code(marker), "silent": True, "store_history": False,
            "user_expressions": {}, "allow_stdin": False, "stop_on_error": False})
        answered = came = replied = False
        try:
            while loop.time() < deadline and (stopped or not self._interrupt_requested):
                while not route.empty():
                    await self._take_late(*route.get_nowait(), emit)
                try:
                    async with asyncio.timeout_at(min(deadline, loop.time() + MARKER_POLL_S)):
                        channel, msg = await marked.get()
                except TimeoutError:
                    continue
                while not route.empty():  # came before this message: goes first
                    await self._take_late(*route.get_nowait(), emit)
                if channel == "died":
                    return False, True  # a death, not a hang: the run's checks act on it
                answered = True
                if channel == "shell":
                    if (msg.get("content") or {}).get("status") != "ok":
                        return False, True  # the marker's code failed: no marker will come
                    replied = True
                    if came:
                        return True, True
                    continue
                content = msg.get("content") if channel == "iopub" else None
                if msg.get("msg_type") != "stream" or not isinstance(content, dict):
                    continue  # the marker's own status and input
                text = str(content.get("text", ""))
                found = marker in text
                text = text.replace(marker + "\n", "").replace(marker, "")
                if text:
                    await self._take_late(channel, {**msg, "content": {**content, "text": text}},
                                          emit)
                came = came or found
                if came and replied:
                    return True, True
            return came, answered
        finally:
            self.kernel.forget(msg_id)

    async def _take_late(self, channel: str, msg: Any, emit: Emit) -> None:
        if channel == "iopub" and isinstance(msg, dict):
            event = translate(msg)
            if event is not None:
                self._emit(event, emit)
                await self._spill()

    async def _channel_lost(self, count: int | None, emit: Emit) -> DoneEvent:
        """End an execution part of whose output was lost with a broken channel: ``error``,
        and the channel re-established (else a fresh kernel) for the next one."""
        broken = await self.kernel.channel_ready()
        if broken is None:
            reason = ("the kernel's output channel broke or stalled during this execution, so "
                      "part of its output was lost; the channel was re-established (variables "
                      "kept)")
            self._emit_stream(StreamEvent(type="stderr", text=f"\n[replgate: {reason}]\n"), emit)
            return DoneEvent(status=self._status or ExecutionStatus.ERROR,
                             execution_count=count, duration_ms=0.0, reason=reason)
        if self.kernel.death is not None:
            return await self._recover_death(self.kernel.death)
        self._usage_before_restart = await self.kernel.sandbox.usage()
        await self.kernel.restart()
        return DoneEvent(status=ExecutionStatus.ERROR, execution_count=None, restarted=True,
                         duration_ms=0.0,
                         reason=f"{broken}; part of the output was lost and a fresh kernel was "
                                "started (variables lost, files kept)")

    def _emit(self, event: OutputEvent, emit: Emit) -> None:
        if isinstance(event, StreamEvent):
            now = asyncio.get_running_loop().time()
            for piece in self._lines.add(event, now):
                self._emit_stream(piece, emit)
            return
        for piece in self._lines.flush():  # an unfinished line goes before what followed it
            self._emit_stream(piece, emit)
        if isinstance(event, DisplayEvent | UpdateDisplayEvent):
            capped = self.limiter.display(event)
            if capped is not None:
                emit(capped)
        elif isinstance(event, ErrorEvent):
            self._errors += 1
            error = self.limiter.error(event)
            if error is not None:
                emit(error)
        elif isinstance(event, ClearOutputEvent):
            clear = self.limiter.clear(event)
            if clear is not None:
                emit(clear)
        else:
            emit(event)

    def _emit_stream(self, event: StreamEvent, emit: Emit) -> None:
        for piece in self.limiter.stream(event.type, event.text):
            emit(piece)

    async def _spill(self, final: bool = False) -> None:
        await spill(self.limiter, self.kernel.sandbox.workspace, final)

    async def _hard_restart(self, reason: str,
                            why: str = "the kernel did not stop") -> DoneEvent:
        logger.info("kernel %s: hard restart after %s (%s)", self.kernel.id, reason, why)
        self._usage_before_restart = await self.kernel.sandbox.usage()
        await self.kernel.restart()
        return DoneEvent(status=self._status or ExecutionStatus.TIMEOUT, execution_count=None,
                         restarted=True, duration_ms=0.0,
                         reason=f"{reason}; {why}, so {self.kernel.hard_stop} "
                                "and a fresh kernel started (variables lost, files kept)")

    async def _recover_death(self, died: KernelDied) -> DoneEvent:
        status = ExecutionStatus.DIED
        if self.kernel.state != KernelState.CLOSED:
            self._usage_before_restart = await self.kernel.sandbox.usage()
            try:
                await self.kernel.restart()
            except KernelPoolError as exc:  # the session stays dead; the next run tries again
                return DoneEvent(status=status, execution_count=None, duration_ms=0.0,
                                 reason=f"{died.reason}; starting a fresh kernel failed: {exc}")
        return DoneEvent(status=status, execution_count=None, restarted=True, duration_ms=0.0,
                         reason=f"{died.reason}; a fresh kernel was started (variables lost, "
                                "files kept)")
