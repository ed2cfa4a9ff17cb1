"""Session budgets: executions, wall time, CPU time and lifetime, counted per session.

Only executions that ran count (not those refused before running). CPU time is the cgroup's
reading for each execution; where it could not be read (a hard restart), the wall time times the
profile's CPUs stands in, an upper bound. Counts live in the gateway's memory: a gateway restart
starts the taken-back sessions' counts again (their lifetime still counts from creation).
"""

from __future__ import annotations

from datetime import UTC, datetime

from gateway.governance.policy import Budgets
from gateway.wire import BudgetOut
from kernel_pool import DoneEvent, Event, ExecutionHandle, SessionPort

__all__ = ["BudgetTracker"]

_MORE = ("create a new session (POST /v1/sessions) for a fresh budget, or ask an operator to "
         "raise {name} in the policy file")


def _age(created_at: str) -> float:
    try:
        created = datetime.fromisoformat(created_at)
    except ValueError:
        return 0.0
    return max(0.0, (datetime.now(UTC) - created).total_seconds())


class BudgetTracker:
    """One session's budget: its limits and what it has used."""

    def __init__(self, limits: Budgets, session: SessionPort) -> None:
        self.limits = limits
        self.session = session
        self.executions = 0
        self.wall_s = 0.0
        self.cpu_s = 0.0

    def __repr__(self) -> str:
        return (f"<BudgetTracker {self.session.id} {self.executions} runs, "
                f"{self.wall_s:.1f}s wall, {self.cpu_s:.1f}s cpu>")

    @property
    def limited(self) -> bool:
        return any(value is not None for value in self.limits.model_dump().values())

    def listener(self, session: SessionPort, handle: ExecutionHandle, event: Event | None) -> None:
        """A :data:`kernel_pool._session.Listener`: counts each execution that ran, at its end."""
        if isinstance(event, DoneEvent) and handle.run is not None:
            self.executions += 1
            wall = event.duration_ms / 1000
            self.wall_s += wall
            cpu = event.metrics.cpu_time_ms
            self.cpu_s += cpu / 1000 if cpu is not None else wall * session.profile.cpus

    def remaining(self) -> BudgetOut:
        limits = self.limits
        lifetime = None
        if limits.max_lifetime_s is not None:
            lifetime = max(0.0, limits.max_lifetime_s - _age(self.session.created_at))
        return BudgetOut(
            executions_left=None if limits.max_executions is None
            else max(0, limits.max_executions - self.executions),
            wall_time_left_s=None if limits.max_wall_time_s is None
            else round(max(0.0, limits.max_wall_time_s - self.wall_s), 3),
            cpu_time_left_s=None if limits.max_cpu_time_s is None
            else round(max(0.0, limits.max_cpu_time_s - self.cpu_s), 3),
            lifetime_left_s=None if lifetime is None else round(lifetime, 3))

    def exceeded(self) -> tuple[str, str] | None:
        """(budget, message) for the first budget used up, or None."""
        left, limits = self.remaining(), self.limits
        if left.executions_left == 0:
            return "max_executions", (
                f"this session has run its budget of {limits.max_executions} executions "
                f"(max_executions); " + _MORE.format(name="max_executions"))
        if left.wall_time_left_s is not None and left.wall_time_left_s <= 0:
            return "max_wall_time_s", (
                f"this session has used its wall-time budget of {limits.max_wall_time_s:g}s "
                f"(max_wall_time_s; {self.wall_s:.1f}s run); "
                + _MORE.format(name="max_wall_time_s"))
        if left.cpu_time_left_s is not None and left.cpu_time_left_s <= 0:
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
