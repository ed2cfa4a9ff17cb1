"""Tenants' secrets as stored: a name, the sealed value (never the value itself) and its times.

Sealing and opening are :mod:`gateway.secrets`'; this room only keeps the sealed text.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from common.store import Store, as_dict, utc_now

__all__ = ["SecretRecord", "SecretRecords"]


class SecretRecord(BaseModel):
    """A secret's name and times: what ``GET /v1/secrets`` lists (never a value)."""

    name: str
    created_at: datetime
    updated_at: datetime


class SecretRecords(Store):
    """The store's secrets."""

    async def put_secret(self, tenant: str, name: str, sealed: str) -> None:
        """Add the tenant's secret, or replace its value (keeping its ``created_at``)."""
        now = utc_now()
        # The same upsert on SQLite (3.24+) and PostgreSQL: one statement, no read first.
        await self._change(
            "INSERT INTO secrets (tenant, name, sealed, created_at, updated_at) VALUES "
            "(:tenant, :name, :sealed, :now, :now) ON CONFLICT (tenant, name) DO UPDATE SET "
            "sealed = excluded.sealed, updated_at = excluded.updated_at",
            tenant=tenant, name=name, sealed=sealed, now=now)

    async def list_secrets(self, tenant: str) -> list[SecretRecord]:
        """The tenant's secrets, by name."""
        rows = await self._fetch("SELECT name, created_at, updated_at FROM secrets WHERE "
                                 "tenant = :tenant ORDER BY name", tenant=tenant)
        return [SecretRecord.model_validate(as_dict(row)) for row in rows]

    async def sealed_secret(self, tenant: str, name: str) -> str | None:
        """The sealed value of the tenant's secret, or None."""
        rows = await self._fetch("SELECT sealed FROM secrets WHERE tenant = :tenant AND "
                                 "name = :name", tenant=tenant, name=name)
        return str(as_dict(rows[0])["sealed"]) if rows else None

    async def delete_secret(self, tenant: str, name: str) -> bool:
        """Remove the tenant's secret; False if it did not exist."""
        return await self._change("DELETE FROM secrets WHERE tenant = :tenant AND name = :name",
                                  tenant=tenant, name=name) > 0
