"""What each session has used of its budgets (governance), whichever gateway ran it."""

from __future__ import annotations

import sqlite3

from sqlalchemy import RowMapping

from common.store import Store

__all__ = ["Usage", "UsageRecords"]

Usage = tuple[int, float, float]
"""What a session has used of its budgets: executions, wall-time seconds, CPU seconds."""


class UsageRecords(Store):
    """The store's budgets' use."""

    async def session_usage(self, session_id: str) -> Usage:
        """What the session has used of its budgets: (executions, wall s, CPU s)."""
        rows = await self._fetch("SELECT executions, wall_s, cpu_s FROM session_usage "
                                 "WHERE session_id = :id", id=session_id)
        return _usage(rows[0]) if rows else (0, 0.0, 0.0)

    async def add_session_usage(self, session_id: str, executions: int, wall_s: float,
                                cpu_s: float) -> Usage:
        """Add to what the session has used, atomically; the totals after."""
        rows = await self._fetch(_ADD_USAGE + _RETURNING_USAGE, id=session_id,
                                 executions=executions, wall_s=wall_s, cpu_s=cpu_s)
        return _usage(rows[0])

    async def claim_execution(self, session_id: str, runs: int, wall_s: float, cpu_s: float,
                              *, max_executions: int | None, max_wall_s: float | None,
                              max_cpu_s: float | None) -> Usage | None:
        """Add one execution (and ``runs``, ``wall_s`` and ``cpu_s`` not saved yet) to the
        session's use, unless a limit given is used up: the totals after, or None (and nothing
        changed). One statement, so that of gateways claiming at once no more pass than the
        limits allow."""
        limits = {"max_executions": max_executions, "max_wall_s": max_wall_s,
                  "max_cpu_s": max_cpu_s}
        used_up = {
            "max_executions": "session_usage.executions + excluded.executions > :max_executions",
            "max_wall_s": "session_usage.wall_s + excluded.wall_s >= :max_wall_s",
            "max_cpu_s": "session_usage.cpu_s + excluded.cpu_s >= :max_cpu_s"}
        given = {name: value for name, value in limits.items() if value is not None}
        unless = (" WHERE NOT (" + " OR ".join(used_up[name] for name in given) + ")"
                  if given else "")
        rows = await self._fetch(
            _ADD_USAGE + unless + _RETURNING_USAGE,
            id=session_id, executions=runs + 1, wall_s=wall_s, cpu_s=cpu_s, **given)
        return _usage(rows[0]) if rows else None


_ADD_USAGE = (
    "INSERT INTO session_usage (session_id, executions, wall_s, cpu_s) "
    "VALUES (:id, :executions, :wall_s, :cpu_s) ON CONFLICT (session_id) DO UPDATE "
    "SET executions = session_usage.executions + excluded.executions, "
    "wall_s = session_usage.wall_s + excluded.wall_s, "
    "cpu_s = session_usage.cpu_s + excluded.cpu_s")
"""Add to a session's use (a claim adds its ``WHERE`` condition after it)."""
_RETURNING_USAGE = " RETURNING executions, wall_s, cpu_s"


def _usage(row: RowMapping | sqlite3.Row) -> Usage:
    return int(row["executions"]), float(row["wall_s"]), float(row["cpu_s"])
