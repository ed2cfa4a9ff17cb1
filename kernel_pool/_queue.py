"""One session's executions in the order they were submitted, and who hears of them.

Both sides of the port keep one: :class:`~kernel_pool.Session` (its executions run here, one at
a time, under the session's lock) and ``node.remote.RemoteSession`` (its executions wait here
for their gate, then for their node to take them). What the two have in common lives here: the
list of executions queued or running, which of them is running, the gate each passes in turn,
the status a queue adds to its session's, and the listeners that hear every event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Iterator
from typing import TYPE_CHECKING, Any

from kernel_pool._handle import ExecutionHandle, refused_at_gate
from kernel_pool.state import SessionStatus

if TYPE_CHECKING:
    from kernel_pool.events import Event
    from kernel_pool.port import Listener, SessionPort

logger = logging.getLogger(__name__)


class ExecutionQueue:
    """A session's executions queued or running (the first is the one that runs), each a task
    of the session's own, and the listeners told of their events."""

    def __init__(self, session: SessionPort) -> None:
        self.session = session
        """What the listeners are told the events are of."""
        self.listeners: list[Listener] = []
        """The session's own list (``session.listeners`` is this one)."""
        self._handles: list[ExecutionHandle] = []
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._handles)

    def __iter__(self) -> Iterator[ExecutionHandle]:
        return iter(list(self._handles))

    @property
    def head(self) -> ExecutionHandle | None:
        """The first execution: the one running, or the next to."""
        return self._handles[0] if self._handles else None

    @property
    def current(self) -> ExecutionHandle | None:
        """The execution running now (started, not yet removed)."""
        head = self.head
        return head if head is not None and head.ran else None

    def status(self, status: SessionStatus) -> SessionStatus:
        """The session's status with its queue: an idle one with executions is busy."""
        if self._handles and status is SessionStatus.IDLE:
            return SessionStatus.BUSY
        return status

    def add(self, handle: ExecutionHandle, work: Coroutine[Any, Any, None], name: str) -> None:
        """Queue ``handle`` last; ``work`` (a task of the session's) runs it and, at its end,
        calls :meth:`remove`."""
        self._handles.append(handle)
        self.spawn(work, name)

    def remove(self, handle: ExecutionHandle) -> None:
        """The execution is over (or never ran): out of the queue."""
        with contextlib.suppress(ValueError):
            self._handles.remove(handle)

    def spawn(self, work: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """A task of the session's own: :meth:`cancel` ends it with the session."""
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def track(self, task: asyncio.Task[Any]) -> None:
        """A task made elsewhere that the session's end must cancel too."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def cancel(self) -> None:
        """Cancel every task of the session's and wait for their end (the session closes)."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    async def refused(self, handle: ExecutionHandle) -> bool:
        """Ask the execution's gate, if any (in queue order: the caller holds its turn); True
        when it ended the execution instead."""
        return handle.gate is not None and await refused_at_gate(
            handle, handle.gate, lambda event: self.publish(handle, event))

    def withdraw(self, context_id: str | None = None) -> bool | None:
        """Withdraw the first execution while its gate holds it (in ``context_id``, if named):
        whether it was; None when the gate holds nothing there."""
        head = self.head
        if (head is None or head.ran or head.gating is None
                or context_id not in (None, head.context_id)):
            return None
        return head.gating.cancel()

    def started(self, handle: ExecutionHandle) -> None:
        """The execution runs now: it is :attr:`current`, and the listeners hear so."""
        handle.ran = True
        self.notify(handle, None)

    def publish(self, handle: ExecutionHandle, event: Event) -> None:
        """An event of the execution: kept on its handle, told to the listeners."""
        handle.add(event)
        self.notify(handle, event)

    def notify(self, handle: ExecutionHandle, event: Event | None) -> None:
        """Tell each listener (``None``: the execution started); one that fails is logged and
        the others are still told."""
        for listener in list(self.listeners):
            try:
                listener(self.session, handle, event)
            except Exception:
                logger.exception("session listener failed")
