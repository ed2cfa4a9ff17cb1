"""What each E2B sandbox's create asked of its end (a JSON object the E2B face reads), beside
the end itself, for whichever gateway reaches the end or sees the sandbox's traffic."""

from __future__ import annotations

from collections.abc import Sequence

from common.store import Store
from gateway.records import in_list

__all__ = ["SandboxLifecycleRecords"]


class SandboxLifecycleRecords(Store):
    """The store's E2B sandboxes' lifecycles."""

    async def set_sandbox_lifecycle(self, session_id: str, tenant: str, lifecycle: str) -> None:
        """Keep the sandbox's lifecycle (its end, if it has one yet, is left as it is)."""
        await self._change(
            "INSERT INTO e2b_sandboxes (session_id, tenant, lifecycle) "
            "VALUES (:id, :tenant, :lifecycle) "
            "ON CONFLICT (session_id) DO UPDATE SET lifecycle = excluded.lifecycle",
            id=session_id, tenant=tenant, lifecycle=lifecycle)

    async def sandbox_lifecycles(self, session_ids: Sequence[str],
                                 ) -> dict[str, tuple[str | None, str | None]]:
        """(end, lifecycle) of those sandboxes that have a record; None where unset (an end
        of None: paused by its SDK or its timeout; a lifecycle of None: E2B's defaults)."""
        if not session_ids:
            return {}
        listed, names = in_list(session_ids)
        rows = await self._fetch(
            "SELECT session_id, end_at, lifecycle FROM e2b_sandboxes "
            f"WHERE session_id IN ({listed})", **names)
        return {str(row["session_id"]): (row["end_at"], row["lifecycle"]) for row in rows}
