"""When each E2B sandbox ends, for whichever gateway is there when it does."""

from __future__ import annotations

from collections.abc import Sequence

from common.store import Store
from gateway.records import in_list

__all__ = ["SandboxEndRecords"]


class SandboxEndRecords(Store):
    """The store's E2B sandboxes' ends."""

    async def set_sandbox_end(self, session_id: str, tenant: str, end_at: str | None, *,
                              later_only: bool = False) -> None:
        """The E2B sandbox ends at ``end_at`` (None: it does not, paused by its SDK);
        ``later_only`` keeps an end already later."""
        keep = (" WHERE e2b_sandboxes.end_at IS NULL OR e2b_sandboxes.end_at < excluded.end_at"
                if later_only else "")
        await self._change(
            "INSERT INTO e2b_sandboxes (session_id, tenant, end_at) VALUES (:id, :tenant, :end) "
            "ON CONFLICT (session_id) DO UPDATE SET end_at = excluded.end_at" + keep,
            id=session_id, tenant=tenant, end=end_at)

    async def sandbox_ends(self, session_ids: Sequence[str]) -> dict[str, str | None]:
        """The recorded ends of those sandboxes that have one (None: paused by its SDK)."""
        if not session_ids:
            return {}
        listed, names = in_list(session_ids)
        rows = await self._fetch(
            f"SELECT session_id, end_at FROM e2b_sandboxes WHERE session_id IN ({listed})",
            **names)
        return {str(row["session_id"]): row["end_at"] for row in rows}

    async def due_sandboxes(self, now: str) -> list[tuple[str, str, str]]:
        """(session, tenant, end) of the sandboxes whose end has come."""
        rows = await self._fetch("SELECT session_id, tenant, end_at FROM e2b_sandboxes "
                                 "WHERE end_at <= :now ORDER BY end_at", now=now)
        return [(str(row["session_id"]), str(row["tenant"]), str(row["end_at"]))
                for row in rows]

    async def claim_sandbox(self, session_id: str, seen_end: str, until: str) -> bool:
        """Take the ending of a sandbox whose end was ``seen_end``, moving its end to
        ``until`` (another gateway tries again then, if this one does not finish); False
        when another gateway took it, or its end moved, first."""
        return bool(await self._change(
            "UPDATE e2b_sandboxes SET end_at = :until WHERE session_id = :id "
            "AND end_at = :seen", until=until, id=session_id, seen=seen_end))

    async def drop_sandbox(self, session_id: str) -> None:
        """Forget a sandbox's end (it was killed, or its session is gone)."""
        await self._change("DELETE FROM e2b_sandboxes WHERE session_id = :id", id=session_id)

    async def next_sandbox_end(self) -> str | None:
        """The earliest end of any sandbox, or None."""
        rows = await self._fetch("SELECT MIN(end_at) AS end_at FROM e2b_sandboxes")
        value = rows[0]["end_at"] if rows else None
        return None if value is None else str(value)
