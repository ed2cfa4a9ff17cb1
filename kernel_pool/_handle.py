"""An execution submitted to a session (:class:`ExecutionHandle`), and the gate it passes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime

from kernel_pool._caused import CausedAction, act_for
from kernel_pool._execution import ExecutionRun
from kernel_pool.events import (
    DoneEvent,
    ErrorEvent,
    Event,
    Execution,
    ExecutionBuilder,
    ExecutionStatus,
)


def utcnow() -> str:
    return datetime.now(UTC).isoformat()


class ExecutionHandle:
    """An execution submitted to a session: its events so far, live, and its result.

    Events are kept (they are capped, so bounded) so that any number of readers, including one
    that connects late, see the whole stream from the start.
    """

    def __init__(self, execution_id: str, code: str, timeout_s: float, *,
                 language: str = "python", context_id: str = "python") -> None:
        self.id = execution_id
        self.code = code
        self.timeout_s = timeout_s
        self.language = language
        """The language it was sent as (``typescript`` runs in the JavaScript context)."""
        self.context_id = context_id
        """The code context it runs in (``python``: the session's own kernel)."""
        self.events: list[Event] = []
        self.done: DoneEvent | None = None
        self.started_at = utcnow()
        self.finished_at: str | None = None
        # Wall-clock marks (``time.time_ns()``) for traces: submitted, out of the queue (the
        # session's lock taken), and done; the run's own are on ``run`` (``sent_ns``, ``idle_ns``).
        self.submitted_ns = time.time_ns()
        self.dequeued_ns: int | None = None
        self.done_ns: int | None = None
        self.actions: list[CausedAction] = []
        """Lifecycle actions this execution caused (a resume, a restore, a restart, another
        session's pause), timed, in the order they ended."""
        self._execution: Execution | None = None
        self.run: ExecutionRun | None = None
        self.gate: Gate | None = None
        self.gating: asyncio.Task[Denial | None] | None = None
        """The gate's task while it holds this execution (an interrupt withdraws it)."""
        self.withdrawn: str | None = None
        """Why it will not run after all (a restart asked while it waited in the queue)."""
        self.ran = False
        """It started: past its gate, taken by the kernel that runs it (in this process) or
        by its node (a remote session's). Whatever ended it after that, it ran (a budget
        counts its time); one that ended before (refused, withdrawn, closed) did not."""
        self._changed = asyncio.Event()
        self._finished = asyncio.Event()

    def dequeued(self) -> None:
        """Its turn came (the session's lock is taken): what its task does from here on, it
        caused (see :func:`~kernel_pool._caused.caused`)."""
        self.dequeued_ns = time.time_ns()
        act_for(self)

    def add(self, event: Event) -> None:
        """One more event of this execution, as its session publishes it (``done`` ends it)."""
        self.events.append(event)
        if isinstance(event, DoneEvent):
            self.done_ns = time.time_ns()
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


Denial = tuple[ExecutionStatus, str, str]
"""Why a gate refused an execution: (status, ename, evalue)."""
Gate = Callable[[ExecutionHandle, Callable[[Event], None]], Awaitable[Denial | None]]
"""Run under the session's lock just before the code would reach the kernel (so order is kept).

It may emit events (e.g. ``pending_approval``), may wait (for a person's approval), may lower
``handle.timeout_s``, and returns None to let the code run or a :data:`Denial` to refuse it:
the execution then ends with an ``error`` event and a ``done`` of that status, never running.
"""


async def refused_at_gate(handle: ExecutionHandle, gate: Gate,
                          publish: Callable[[Event], None]) -> bool:
    """Ask the gate; on a denial end the execution (error, done) without running it.

    An interrupt meanwhile (``handle.gating`` cancelled) withdraws it the same way.
    """
    started = time.monotonic()
    gating = asyncio.ensure_future(gate(handle, publish))
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
    publish(ErrorEvent(ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"]))
    publish(DoneEvent(status=status, execution_count=None, reason=evalue,
                      duration_ms=round((time.monotonic() - started) * 1000, 3)))
    return True
