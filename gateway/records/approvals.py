"""Approvals of held executions (governance), in the database so that any gateway decides them."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from sqlalchemy import RowMapping

from common.store import Store, as_dict
from gateway.records import in_list
from gateway.wire import Approval

__all__ = ["ApprovalRecords"]


class ApprovalRecords(Store):
    """The store's approvals."""

    async def add_approval(self, approval: Approval) -> None:
        """Record a held execution's approval, pending."""
        row = approval.model_dump(mode="json")
        await self._change(
            "INSERT INTO approvals (id, tenant, session_id, execution_id, code, rules, status, "
            "created_at, expires_at) VALUES (:approval_id, :tenant, :session_id, "
            ":execution_id, :code, :rules, :status, :created_at, :expires_at)",
            **{name: row[name] for name in (
                "approval_id", "tenant", "session_id", "execution_id", "code", "status",
                "created_at", "expires_at")},
            rules=json.dumps(row["rules"], separators=(",", ":")))

    async def get_approval(self, approval_id: str) -> Approval | None:
        """The approval with that id, pending or decided, or None."""
        rows = await self._fetch("SELECT * FROM approvals WHERE id = :id", id=approval_id)
        return _approval_from_row(rows[0]) if rows else None

    async def pending_approvals(self, tenant: str, now: str) -> list[Approval]:
        """The tenant's approvals still pending and not past their expiry, oldest first."""
        rows = await self._fetch(
            "SELECT * FROM approvals WHERE tenant = :tenant AND status = 'pending' "
            "AND expires_at > :now ORDER BY created_at, id", tenant=tenant, now=now)
        return [_approval_from_row(row) for row in rows]

    async def close_approval(self, approval_id: str, status: str, at: str, *,
                             by: str | None = None, comment: str | None = None,
                             tenant: str | None = None) -> Approval | None:
        """Decide a pending approval (``approved``, ``rejected``, ``expired``, ``withdrawn``)
        and return it; None when it is not pending (decided first elsewhere), not the
        tenant's, or (for a person's decision) past its expiry. One statement, so of two
        gateways deciding at once one wins."""
        person = status in ("approved", "rejected")
        rows = await self._fetch(
            "UPDATE approvals SET status = :status, decided_by = :by, decided_at = :at, "
            "comment = :comment WHERE id = :id AND status = 'pending'"
            + (" AND tenant = :tenant" if tenant is not None else "")
            + (" AND expires_at > :at" if person else "") + " RETURNING *",
            status=status, by=by, at=at, comment=comment, id=approval_id, tenant=tenant)
        return _approval_from_row(rows[0]) if rows else None

    async def decided_approvals(self, approval_ids: Sequence[str]) -> list[Approval]:
        """Those of the approvals named that are no longer pending."""
        if not approval_ids:
            return []
        listed, names = in_list(approval_ids)
        rows = await self._fetch(
            f"SELECT * FROM approvals WHERE id IN ({listed}) AND status <> 'pending'", **names)
        return [_approval_from_row(row) for row in rows]


def _approval_from_row(row: RowMapping | sqlite3.Row) -> Approval:
    data = as_dict(row)
    data["approval_id"] = data.pop("id")
    data["rules"] = json.loads(data["rules"])
    return Approval.model_validate(data)
