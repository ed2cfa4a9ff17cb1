"""Tenants' secrets as stored: a name, the sealed value (never the value itself), its times,
its version (how many values it has had) and the tenant's metadata for it.

Sealing and opening are :mod:`gateway.secrets`'; this room only keeps the sealed text.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, field_validator

from common.store import Store, as_dict, utc_now

__all__ = ["SecretRecord", "SecretRecords"]


class SecretRecord(BaseModel):
    """A secret's name and times: what ``GET /v1/secrets`` lists (never a value)."""

    name: str
    created_at: datetime
    updated_at: datetime
    version: int = 1
    """1 when stored, one more at each replacement of its value."""
    metadata: dict[str, str] = Field(default_factory=dict)
    """The tenant's labels for it (E2B's ``metadata``)."""

    @field_validator("metadata", mode="before")
    @classmethod
    def _stored(cls, value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) else value


class SecretRecords(Store):
    """The store's secrets."""

    async def put_secret(self, tenant: str, name: str, sealed: str) -> None:
        """Add the tenant's secret, or replace its value (keeping its ``created_at``, one
        more version)."""
        now = utc_now()
        # The same upsert on SQLite (3.24+) and PostgreSQL: one statement, no read first.
        await self._change(
            "INSERT INTO secrets (tenant, name, sealed, created_at, updated_at) VALUES "
            "(:tenant, :name, :sealed, :now, :now) ON CONFLICT (tenant, name) DO UPDATE SET "
            "sealed = excluded.sealed, updated_at = excluded.updated_at, "
            "version = secrets.version + 1",
            tenant=tenant, name=name, sealed=sealed, now=now)

    async def add_secret(self, tenant: str, name: str, sealed: str,
                         metadata: dict[str, str]) -> bool:
        """Add the tenant's secret; False (nothing changed) if one of that name exists."""
        now = utc_now()
        return await self._change(
            "INSERT INTO secrets (tenant, name, sealed, created_at, updated_at, version, "
            "metadata) VALUES (:tenant, :name, :sealed, :now, :now, 1, :metadata) "
            "ON CONFLICT (tenant, name) DO NOTHING", tenant=tenant, name=name, sealed=sealed,
            now=now, metadata=json.dumps(metadata)) > 0

    async def replace_secret(self, tenant: str, name: str, sealed: str,
                             metadata: dict[str, str] | None) -> bool:
        """Replace an existing secret's value (one more version) and, unless None, its
        metadata; False if there is none of that name."""
        return await self._change(
            "UPDATE secrets SET sealed = :sealed, updated_at = :now, version = version + 1, "
            "metadata = COALESCE(:metadata, metadata) WHERE tenant = :tenant AND name = :name",
            tenant=tenant, name=name, sealed=sealed, now=utc_now(),
            metadata=None if metadata is None else json.dumps(metadata)) > 0

    async def list_secrets(self, tenant: str) -> list[SecretRecord]:
        """The tenant's secrets, by name."""
        rows = await self._fetch("SELECT name, created_at, updated_at, version, metadata FROM "
                                 "secrets WHERE tenant = :tenant ORDER BY name", tenant=tenant)
        return [SecretRecord.model_validate(as_dict(row)) for row in rows]

    async def secret_record(self, tenant: str, name: str) -> SecretRecord | None:
        """The tenant's secret of that name (without its value), or None."""
        rows = await self._fetch("SELECT name, created_at, updated_at, version, metadata FROM "
                                 "secrets WHERE tenant = :tenant AND name = :name",
                                 tenant=tenant, name=name)
        return SecretRecord.model_validate(as_dict(rows[0])) if rows else None

    async def sealed_secret(self, tenant: str, name: str) -> str | None:
        """The sealed value of the tenant's secret, or None."""
        rows = await self._fetch("SELECT sealed FROM secrets WHERE tenant = :tenant AND "
                                 "name = :name", tenant=tenant, name=name)
        return str(as_dict(rows[0])["sealed"]) if rows else None

    async def delete_secret(self, tenant: str, name: str) -> bool:
        """Remove the tenant's secret; False if it did not exist."""
        return await self._change("DELETE FROM secrets WHERE tenant = :tenant AND name = :name",
                                  tenant=tenant, name=name) > 0
