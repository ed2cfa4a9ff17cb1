"""A session: one kernel and its workspace, running executions one at a time, in order."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from kernel_pool.config import PoolSettings, Profile
from kernel_pool.events import (
    DoneEvent,
    ErrorEvent,
    Event,
    Execution,
    ExecutionBuilder,
    ExecutionStatus,
)
from kernel_pool.exceptions import InvalidRequest, QueueFull, SessionClosed
from kernel_pool.execution import ExecutionRun
from kernel_pool.kernel import Kernel, KernelDied, KernelState

logger = logging.getLogger(__name__)


class SessionStatus(StrEnum):
    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    DEAD = "dead"


def utcnow() -> str:
    return datetime.now(UTC).isoformat()


class ExecutionHandle:
    """An execution submitted to a session: its events so far, live, and its result.

    Events are kept (they are capped, so bounded) so that any number of readers, including one
    that connects late, see the whole stream from the start.
    """

    def __init__(self, execution_id: str, code: str, timeout_s: float) -> None:
        self.id = execution_id
        self.code = code
        self.timeout_s = timeout_s
        self.events: list[Event] = []
        self.done: DoneEvent | None = None
        self.started_at = utcnow()
        self.finished_at: str | None = None
        self._execution: Execution | None = None
        self.run: ExecutionRun | None = None
        self.gate: Gate | None = None
        self.gating: asyncio.Task[Denial | None] | None = None
        self.withdrawn: str | None = None
        """Why it will not run after all (a restart asked while it waited in the queue)."""
        """The gate's task while it holds this execution (an interrupt withdraws it)."""
        self._changed = asyncio.Event()
        self._finished = asyncio.Event()

    def _add(self, event: Event) -> None:
        self.events.append(event)
        if isinstance(event, DoneEvent):
            self.done = event
            self.finished_at = utcnow()
            self._finished.set()
        self._changed.set()

    async def stream(self) -> AsyncIterator[Event]:
        """Every event of this execution, from the first, as they happen; ends after ``done``."""
        index = 0
        while True:
            while index < len(self.events):
                event = self.events[index]
                index += 1
                yield event
                if isinstance(event, DoneEvent):
                    return
            self._changed.clear()
            if index < len(self.events):
                continue
            await self._changed.wait()

    async def result(self) -> Execution:
        await self._finished.wait()
        return self.execution()

    def execution(self) -> Execution:
        """The aggregate of the events so far (built once only after ``done``: its readers,
        history, audit and every waiting client, share it and must not change it)."""
        if self._execution is not None:
            return self._execution
        builder = ExecutionBuilder()
        for event in self.events:
            builder.add(event)
        execution = builder.build()
        if self.done is not None:
            self._execution = execution
        return execution


Listener = Callable[["Session", ExecutionHandle, Event | None], None]
"""Called when an execution starts (event None) and for each of its events."""

Denial = tuple[ExecutionStatus, str, str]
"""Why a gate refused an execution: (status, ename, evalue)."""
Gate = Callable[[ExecutionHandle, Callable[[Event], None]], Awaitable[Denial | None]]
"""Run under the session's lock just before the code would reach the kernel (so order is kept).

It may emit events (e.g. ``pending_approval``), may wait (for a person's approval), may lower
``handle.timeout_s``, and returns None to let the code run or a :data:`Denial` to refuse it:
the execution then ends with an ``error`` event and a ``done`` of that status, never running.
"""


class Session:
    """One kernel with its workspace. Executions queue (bounded) and run one at a time."""

    def __init__(self, kernel: Kernel, profile: Profile, settings: PoolSettings, *,
                 session_id: str | None = None, env: dict[str, str] | None = None,
                 metadata: dict[str, Any] | None = None) -> None:
        self.id = session_id or str(uuid.uuid4())
        self.kernel = kernel
        kernel.on_death = self._kernel_died
        if kernel.egress is not None:
            kernel.egress.session_id = self.id  # egress attempts are logged with the session
        self.profile = profile
        self.env = dict(env or {})
        self.metadata = dict(metadata or {})
        self.created_at = utcnow()
        self.last_active_at = self.created_at
        self.execution_count = 0
        self._settings = settings
        self._created_mono = time.monotonic()
        self._active_mono = self._created_mono
        self._lock = asyncio.Lock()
        self._pending: list[ExecutionHandle] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._restarting = False
        self.listeners: list[Listener] = []

    def __repr__(self) -> str:
        return f"<Session {self.id} {self.status.value} queued={len(self._pending)}>"

    @property
    def status(self) -> SessionStatus:
        if self._closed or self.kernel.state in (KernelState.DEAD, KernelState.CLOSED):
            return SessionStatus.DEAD
        if self._restarting or self.kernel.state in (KernelState.STARTING,
                                                     KernelState.RESTARTING):
            return SessionStatus.STARTING
        return SessionStatus.BUSY if self._pending else SessionStatus.IDLE

    @property
    def pending(self) -> int:
        """Executions queued or running."""
        return len(self._pending)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def current(self) -> ExecutionHandle | None:
        return self._pending[0] if self._pending and self._pending[0].run else None

    def idle_for(self) -> float:
        return 0.0 if self._pending else time.monotonic() - self._active_mono

    def age(self) -> float:
        return time.monotonic() - self._created_mono

    def check_timeout(self, timeout_s: float | None) -> float:
        """The timeout to use, or InvalidRequest naming the profile's range."""
        value = self.profile.default_timeout_s if timeout_s is None else float(timeout_s)
        if not 0 < value <= self.profile.max_timeout_s:
            raise InvalidRequest(
                f"timeout_s must be above 0 and at most {self.profile.max_timeout_s:g} "
                f"(profile {self.profile.name!r}); got {timeout_s}")
        return value

    def submit(self, code: str, timeout_s: float | None = None,
               execution_id: str | None = None, gate: Gate | None = None) -> ExecutionHandle:
        """Queue ``code``; returns at once with a handle to stream or await.

        ``gate``, if given, decides under the session's lock whether the code runs (see
        :data:`Gate`).
        """
        if self._closed:
            raise SessionClosed(self.id)
        timeout = self.check_timeout(timeout_s)
        if len(self._pending) >= self._settings.max_queued_executions:
            raise QueueFull(self.id, self._settings.max_queued_executions)
        handle = ExecutionHandle(execution_id or uuid.uuid4().hex, code, timeout)
        handle.gate = gate
        self._pending.append(handle)
        self._touch()
        task = asyncio.create_task(self._execute(handle), name=f"exec-{handle.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return handle

    async def execute(self, code: str, timeout_s: float | None = None) -> Execution:
        """Run ``code`` and return the aggregate result."""
        return await self.submit(code, timeout_s).result()

    async def _execute(self, handle: ExecutionHandle) -> None:
        try:
            async with self._lock:
                if self._closed:
                    raise SessionClosed(self.id)
                if handle.withdrawn is not None:
                    self._publish(handle, DoneEvent(
                        status=ExecutionStatus.INTERRUPTED, execution_count=None,
                        duration_ms=0.0, reason=handle.withdrawn))
                    return
                if handle.gate is not None and await self._refused(handle, handle.gate):
                    return
                run = ExecutionRun(self.kernel, handle.code, timeout_s=handle.timeout_s,
                                   caps=self.profile.caps, execution_id=handle.id,
                                   interrupt_grace_s=self._settings.interrupt_grace_s)
                handle.run = run
                handle.started_at = utcnow()
                self._notify(handle, None)
                done = await run.run(lambda event: self._publish(handle, event))
                if done.execution_count is not None:
                    self.execution_count = done.execution_count
                elif done.restarted:
                    self.execution_count = 0
                self._publish(handle, done)
        except BaseException as exc:
            if handle.done is None:
                reason = ("the session was closed" if self._closed
                          else f"internal error: {exc!r}")
                if not isinstance(exc, asyncio.CancelledError | SessionClosed):
                    logger.exception("execution %s failed", handle.id)
                self._publish(handle, DoneEvent(status=ExecutionStatus.DIED, execution_count=None,
                                                duration_ms=0.0, reason=reason))
            if not isinstance(exc, Exception):
                raise
        finally:
            with contextlib.suppress(ValueError):
                self._pending.remove(handle)
            self._touch()
            death = self.kernel.death
            if not self._closed and self.kernel.state == KernelState.DEAD and death is not None:
                self._kernel_died(death)  # died in the clean-up after the reply

    def _kernel_died(self, died: KernelDied) -> None:
        """The kernel died: a running execution recovers it; between executions, or after an
        execution's reply (its clean-up can stop the sandbox: gVisor's swarm), we do."""
        current = self.current
        if self._closed or (current is not None and current.done is None):
            return
        task = asyncio.create_task(self._recover(died), name=f"recover-{self.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _recover(self, died: KernelDied) -> None:
        async with self._lock:
            if self._closed or self.kernel.state != KernelState.DEAD:
                return
            logger.info("session %s: kernel died between executions (%s); restarting it",
                        self.id, died.reason)
            self._restarting = True
            try:
                await self.kernel.restart()
                self.execution_count = 0
            except Exception:
                logger.exception("session %s: restarting its dead kernel failed", self.id)
            finally:
                self._restarting = False

    async def _refused(self, handle: ExecutionHandle, gate: Gate) -> bool:
        """Ask the gate; on a denial end the execution (error, done) without running it."""
        started = time.monotonic()
        gating = asyncio.ensure_future(gate(handle, lambda e: self._publish(handle, e)))
        handle.gating = gating
        try:
            denial = await gating
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if (task is not None and task.cancelling()) or not gating.cancelled():
                raise
            denial = (ExecutionStatus.INTERRUPTED, "KeyboardInterrupt",
                      "interrupted on request before it ran (it was held by the gate)")
        finally:
            handle.gating = None
        if denial is None:
            return False
        status, ename, evalue = denial
        self._publish(handle, ErrorEvent(ename=ename, evalue=evalue,
                                         traceback=[f"{ename}: {evalue}"]))
        self._publish(handle, DoneEvent(
            status=status, execution_count=None, reason=evalue,
            duration_ms=round((time.monotonic() - started) * 1000, 3)))
        return True

    def _publish(self, handle: ExecutionHandle, event: Event) -> None:
        handle._add(event)
        self._notify(handle, event)

    def _notify(self, handle: ExecutionHandle, event: Event | None) -> None:
        for listener in list(self.listeners):
            try:
                listener(self, handle, event)
            except Exception:
                logger.exception("session listener failed")

    def _touch(self) -> None:
        self._active_mono = time.monotonic()
        self.last_active_at = utcnow()

    def interrupt(self) -> bool:
        """Interrupt the running execution; False when nothing was running."""
        current = self.current
        if current is None and self._pending and self._pending[0].gating is not None:
            return self._pending[0].gating.cancel()  # held by its gate: withdraw it
        return bool(current and current.run and current.run.interrupt())

    async def restart(self) -> None:
        """A fresh kernel on the same workspace: variables gone, files kept."""
        if self._closed:
            raise SessionClosed(self.id)
        # What waits in the queue is withdrawn, so the restart does not wait for all of it
        # to run first (up to the queue's length times the timeout); what is sent after it
        # runs on the fresh kernel.
        for handle in self._pending:
            if handle.run is None and handle.gating is None:
                handle.withdrawn = "withdrawn: the session was restarted before it ran"
        self.interrupt()
        self._restarting = True
        # A task of the session's own: ``close`` cancels and awaits it like an execution, so
        # a deletion during a restart neither hangs nor leaves a container made after it; and
        # a caller that goes away does not cut the restart half-way.
        restarting = asyncio.create_task(self._restart(), name=f"restart-{self.id}")
        self._tasks.add(restarting)
        restarting.add_done_callback(self._tasks.discard)
        try:
            await asyncio.shield(restarting)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if restarting.cancelled() and self._closed and not (task and task.cancelling()):
                raise SessionClosed(self.id) from None
            raise

    async def _restart(self) -> None:
        try:
            async with self._lock:
                if self._closed:
                    raise SessionClosed(self.id)
                await self.kernel.restart()
                self.execution_count = 0
        finally:
            self._restarting = False
            self._touch()

    async def close(self) -> None:
        """Stop everything and remove the sandbox (container and workspace)."""
        if self._closed:
            return
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        await self.kernel.close()
