"""What an execution caused beyond running its code, timed for the gateway's traces.

Starting an execution may resume its paused session (restoring a memory image), restart a
kernel, or pause another session to free a running-kernel slot. Each of these is recorded on
the execution whose task did it, found through a context variable (every task the execution
starts inherits it), with its wall-clock start and end: the gateway draws them as child spans
after the fact, so kernel_pool needs no tracing library and pays a context variable's read
when nothing traces.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class CausedAction:
    """A lifecycle action an execution caused: ``kind`` is ``"resume"``, ``"restore"``,
    ``"restart"`` or ``"pause"``; times are ``time.time_ns()`` (nanoseconds since the epoch);
    ``failed`` when it raised (a cancellation too)."""

    kind: str
    start_ns: int
    end_ns: int
    failed: bool


class Execution(Protocol):
    """What an action is recorded on (an :class:`~kernel_pool.ExecutionHandle`): typed here
    by what this module uses, so that it stays below the handle, which imports it."""

    @property
    def done(self) -> object | None:
        """Set once the execution ended: nothing is recorded on it after that."""

    actions: list[CausedAction]


_acting_for: ContextVar[Execution | None] = ContextVar("kernel_pool_execution", default=None)


def act_for(handle: Execution) -> None:
    """From here on, the current task (and the tasks it starts) works for ``handle``."""
    _acting_for.set(handle)


def caused(kind: str) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Time each call of the decorated coroutine function on the execution it works for, if
    any and still running (a task that outlives its execution adds nothing to it)."""

    def decorate(function: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(function)
        async def timed(*args: P.args, **kwargs: P.kwargs) -> R:
            handle = _acting_for.get()
            if handle is None or handle.done is not None:
                return await function(*args, **kwargs)
            start = time.time_ns()
            failed = True
            try:
                result = await function(*args, **kwargs)
                failed = False
                return result
            finally:
                handle.actions.append(CausedAction(kind, start, time.time_ns(), failed))

        return timed

    return decorate
