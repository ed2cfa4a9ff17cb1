"""Saved snapshots' records: whose each one is, what it was taken of, what it takes, for every
gateway sharing the database (the snapshot itself is a bundle in the bundle store)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy.exc import IntegrityError

from common.store import RecordExists, Store, as_dict

__all__ = ["SnapshotRecord", "SnapshotRecords"]

_JSON_COLUMNS = ("env", "kept", "not_kept")


class SnapshotRecord(BaseModel):
    """One saved snapshot of a tenant."""

    id: str
    tenant: str
    name: str | None = None
    """Unique per tenant; a new snapshot of the same name takes it over."""
    session_id: str
    """The session it was taken of (which may have ended since)."""
    profile: str
    env: dict[str, str] = Field(default_factory=dict)
    memory: bool = True
    """Whether it holds the kernel's variables (else its files alone)."""
    kept: list[str] = Field(default_factory=list)
    not_kept: dict[str, str] = Field(default_factory=dict)
    size_bytes: int = 0
    created_at: datetime


def _row(record: SnapshotRecord) -> dict[str, Any]:
    row = record.model_dump(mode="json")
    for name in _JSON_COLUMNS:
        row[name] = json.dumps(row[name], separators=(",", ":"))
    row["memory"] = int(record.memory)
    return row


def _record(row: Any) -> SnapshotRecord:
    data = as_dict(row)
    for name in _JSON_COLUMNS:
        data[name] = json.loads(data[name])
    return SnapshotRecord.model_validate(data)


class SnapshotRecords(Store):
    """The store's saved snapshots."""

    async def add_snapshot(self, record: SnapshotRecord) -> None:
        """Record a snapshot; :class:`RecordExists` when its id, or its name for its tenant,
        is taken."""
        row = _row(record)
        try:
            await self._change(f"INSERT INTO snapshots ({', '.join(row)}) VALUES "
                               f"({', '.join(':' + name for name in row)})", **row)
        except IntegrityError as exc:
            raise RecordExists("snapshot", record.name or record.id) from exc

    async def get_snapshot(self, tenant: str, snapshot_id: str) -> SnapshotRecord | None:
        """The tenant's snapshot of that id, or None (another tenant's is as absent)."""
        rows = await self._fetch("SELECT * FROM snapshots WHERE id = :id AND tenant = :tenant",
                                 id=snapshot_id, tenant=tenant)
        return _record(rows[0]) if rows else None

    async def named_snapshot(self, tenant: str, name: str) -> SnapshotRecord | None:
        """The tenant's snapshot of that name, or None."""
        rows = await self._fetch("SELECT * FROM snapshots WHERE tenant = :tenant AND "
                                 "name = :name", tenant=tenant, name=name)
        return _record(rows[0]) if rows else None

    async def list_snapshots(self, tenant: str, *, name: str | None = None,
                             session_id: str | None = None) -> list[SnapshotRecord]:
        """The tenant's snapshots, newest first (of that name, or taken of that session)."""
        where, params = ["tenant = :tenant"], {"tenant": tenant}
        if name is not None:
            where.append("name = :name")
            params["name"] = name
        if session_id is not None:
            where.append("session_id = :session_id")
            params["session_id"] = session_id
        rows = await self._fetch(f"SELECT * FROM snapshots WHERE {' AND '.join(where)} "
                                 "ORDER BY created_at DESC, id", **params)
        return [_record(row) for row in rows]

    async def snapshot_usage(self, tenant: str) -> tuple[int, int]:
        """How many snapshots the tenant has, and the bytes they take."""
        rows = await self._fetch("SELECT COUNT(*) AS n, COALESCE(SUM(size_bytes), 0) AS size "
                                 "FROM snapshots WHERE tenant = :tenant", tenant=tenant)
        return int(rows[0]["n"]), int(rows[0]["size"])

    async def delete_snapshot_record(self, tenant: str, snapshot_id: str) -> bool:
        """Forget the tenant's snapshot; False when there was none."""
        return bool(await self._change(
            "DELETE FROM snapshots WHERE id = :id AND tenant = :tenant", id=snapshot_id,
            tenant=tenant))
