"""Session budgets: executions, wall time, CPU time and lifetime, counted per session.

Only executions that ran count (not those refused before running). CPU time is the cgroup's
reading for each execution; where it could not be read (a hard restart, or a session on a node,
whose readings stay there), the wall time times the profile's CPUs stands in, an upper bound.

What a session has used is kept in the database (``session_usage``), so that it outlives a
gateway restart and, on many machines, counts each execution once whichever gateway ran it. The
gate claims an execution before it runs (given back if it then does not run); its wall and CPU
time are added as it ends, off the execution's path. On a shared database the claim is one
conditional statement, so that of executions sent through several gateways, one right after
another or at once, no more pass than the budget allows. On SQLite (one gateway's alone) the
claim is counted here and saved as the execution ends: one machine pays no extra round trip.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from common.policy import Budgets
from gateway.store import Store
from gateway.wire import BudgetOut
from kernel_pool import DoneEvent, Event, ExecutionHandle, SessionPort

__all__ = ["BudgetTracker"]

logger = logging.getLogger(__name__)

Usage = tuple[int, float, float]
"""Executions, wall seconds and CPU seconds."""

_MORE = ("create a new session (POST /v1/sessions) for a fresh budget, or ask an operator to "
         "raise {name} in the policy file")


def _age(created_at: str) -> float:
    try:
        created = datetime.fromisoformat(created_at)
    except ValueError:
        return 0.0
    return max(0.0, (datetime.now(UTC) - created).total_seconds())


class BudgetTracker:
    """One session's budget: its limits and what it has used, as this gateway knows it."""

    def __init__(self, limits: Budgets, session: SessionPort, store: Store) -> None:
        self.limits = limits
        self.session = session
        self.store = store
        self.executions = 0
        self.wall_s = 0.0
        self.cpu_s = 0.0
        self.ours: set[str] = set()
        """Executions claimed at this gateway's gate: only these are counted here (a session
        followed on its node also tells of executions other gateways ran, which they count)."""
        self._unsaved = (0, 0.0, 0.0)
        self._saving = asyncio.Lock()
        self._read = False
        self._tasks: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return (f"<BudgetTracker {self.session.id} {self.executions} runs, "
                f"{self.wall_s:.1f}s wall, {self.cpu_s:.1f}s cpu>")

    @property
    def limited(self) -> bool:
        return any(value is not None for value in self.limits.model_dump().values())

    def listener(self, session: SessionPort, handle: ExecutionHandle, event: Event | None) -> None:
        """A :data:`kernel_pool._session.Listener`: adds each claimed execution's time as it
        ends, or gives its claim back if it did not run.

        An execution ran once its session started it (``handle.ran``: in this process, a run
        in the kernel; on a node, the node took it): whatever stopped it after that counts."""
        if not isinstance(event, DoneEvent) or handle.id not in self.ours:
            return
        self.ours.discard(handle.id)
        if handle.ran:
            wall = event.duration_ms / 1000
            cpu_ms = event.metrics.cpu_time_ms
            cpu = cpu_ms / 1000 if cpu_ms is not None else wall * session.profile.cpus
            self.wall_s += wall
            self.cpu_s += cpu
            self._unsave(0, wall, cpu)
            self._save_soon()
        else:
            self._give_back()

    def _unsave(self, runs: int, wall_s: float, cpu_s: float) -> None:
        """Add to what this gateway counted and has not saved yet."""
        old_runs, old_wall, old_cpu = self._unsaved
        self._unsaved = (old_runs + runs, old_wall + wall_s, old_cpu + cpu_s)

    def _learn(self, totals: Usage) -> None:
        """The session's use is the database's totals, plus what is not saved yet (it ended
        while the database answered, and is saved next time)."""
        self._read = True
        runs, walls, cpus = self._unsaved
        self.executions = totals[0] + runs
        self.wall_s = totals[1] + walls
        self.cpu_s = totals[2] + cpus

    async def claim(self) -> tuple[str, str] | None:
        """Count an execution at the gate, unless a budget is used up: then (budget, message),
        and nothing is counted."""
        if not self.store.database.shared:
            await self.refresh()  # the first time only: then this gateway knows it all
            exceeded = self.exceeded()
            if exceeded is None:
                self.executions += 1
                self._unsave(1, 0.0, 0.0)
            return exceeded
        attempt = asyncio.ensure_future(self._claim_shared())
        try:
            return await asyncio.shield(attempt)
        except asyncio.CancelledError:
            # Withdrawn while the database answered: a claim made meanwhile is given back.
            attempt.add_done_callback(self._give_back_if_claimed)
            raise

    async def _claim_shared(self) -> tuple[str, str] | None:
        while True:
            if self._lifetime_left() == 0.0:
                await self.refresh()
                return self.exceeded()
            claimed = False

            async def claim_or_save(unsaved: Usage) -> Usage:
                nonlocal claimed
                totals = await self.store.claim_execution(
                    self.session.id, *unsaved, max_executions=self.limits.max_executions,
                    max_wall_s=self.limits.max_wall_time_s, max_cpu_s=self.limits.max_cpu_time_s)
                claimed = totals is not None
                if totals is None:  # used up: still save what was unsaved
                    totals = await self.store.add_session_usage(self.session.id, *unsaved)
                return totals

            await self._write(claim_or_save)
            if claimed:
                return None
            exceeded = self.exceeded()
            if exceeded is not None:
                return exceeded
            # A claim was given back between the two statements: claim again.

    def _give_back_if_claimed(self, attempt: asyncio.Future[tuple[str, str] | None]) -> None:
        if not attempt.cancelled() and attempt.exception() is None and attempt.result() is None:
            self._give_back()

    def _give_back(self) -> None:
        """An execution claimed did not run: it does not count."""
        self.executions -= 1
        self._unsave(-1, 0.0, 0.0)
        self._save_soon()

    def _save_soon(self) -> None:
        task = asyncio.get_running_loop().create_task(self._save())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _save(self) -> None:
        try:
            await self.refresh()
        except Exception as exc:  # kept unsaved: the next execution's gate saves it
            logger.warning("session %s: budget use not saved yet: %s", self.session.id, exc)

    async def refresh(self) -> None:
        """Save what this gateway added, and (on a shared database, or the first time) learn
        what the session has used in all."""
        async def save_or_read(unsaved: Usage) -> Usage | None:
            if unsaved != (0, 0.0, 0.0):
                return await self.store.add_session_usage(self.session.id, *unsaved)
            if self.store.database.shared or not self._read:
                return await self.store.session_usage(self.session.id)
            return None

        await self._write(save_or_read)

    async def _write(self, write: Callable[[Usage], Awaitable[Usage | None]]) -> None:
        """Hand what is unsaved to ``write``, one write at a time, and learn the totals it
        answers; if it fails, what it was handed stays unsaved."""
        async with self._saving:
            unsaved, self._unsaved = self._unsaved, (0, 0.0, 0.0)
            try:
                totals = await write(unsaved)
            except BaseException:
                self._unsave(*unsaved)
                raise
            if totals is not None:
                self._learn(totals)

    def _lifetime_left(self) -> float | None:
        if self.limits.max_lifetime_s is None:
            return None
        age = _age(self.session.state().created_at)
        return round(max(0.0, self.limits.max_lifetime_s - age), 3)

    def remaining(self) -> BudgetOut:
        limits = self.limits
        lifetime = self._lifetime_left()
        return BudgetOut(
            executions_left=None if limits.max_executions is None
            else max(0, limits.max_executions - self.executions),
            wall_time_left_s=None if limits.max_wall_time_s is None
            else round(max(0.0, limits.max_wall_time_s - self.wall_s), 3),
            cpu_time_left_s=None if limits.max_cpu_time_s is None
            else round(max(0.0, limits.max_cpu_time_s - self.cpu_s), 3),
            lifetime_left_s=lifetime)

    def exceeded(self) -> tuple[str, str] | None:
        """(budget, message) for the first budget used up, or None (times compared unrounded,
        as :meth:`gateway.store.Store.claim_execution` compares them)."""
        left, limits = self.remaining(), self.limits
        if left.executions_left == 0:
            return "max_executions", (
                f"this session has run its budget of {limits.max_executions} executions "
                f"(max_executions); " + _MORE.format(name="max_executions"))
        if limits.max_wall_time_s is not None and self.wall_s >= limits.max_wall_time_s:
            return "max_wall_time_s", (
                f"this session has used its wall-time budget of {limits.max_wall_time_s:g}s "
                f"(max_wall_time_s; {self.wall_s:.1f}s run); "
                + _MORE.format(name="max_wall_time_s"))
        if limits.max_cpu_time_s is not None and self.cpu_s >= limits.max_cpu_time_s:
            return "max_cpu_time_s", (
                f"this session has used its CPU-time budget of {limits.max_cpu_time_s:g}s "
                f"(max_cpu_time_s; {self.cpu_s:.1f}s used); "
                + _MORE.format(name="max_cpu_time_s"))
        if left.lifetime_left_s is not None and left.lifetime_left_s <= 0:
            return "max_lifetime_s", (
                f"this session is older than its lifetime budget of {limits.max_lifetime_s:g}s "
                "(max_lifetime_s); " + _MORE.format(name="max_lifetime_s"))
        return None

    def clamp(self, timeout_s: float) -> float:
        """``timeout_s``, lowered to the wall time and lifetime left."""
        left = self.remaining()
        bounds = [b for b in (left.wall_time_left_s, left.lifetime_left_s) if b is not None]
        return min([timeout_s, *bounds]) if bounds else timeout_s

    def used(self) -> dict[str, float | int]:
        return {"executions": self.executions, "wall_time_s": round(self.wall_s, 3),
                "cpu_time_s": round(self.cpu_s, 3)}
