"""Hashed API keys in the database: every gateway sharing it knows a key any of them added."""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import time

from common.database import Database
from common.keys import hash_api_key
from common.store import Store, utc_now

__all__ = ["KEYS_FRESH_S", "KEYS_READ_AHEAD_S", "KeyRecords"]

logger = logging.getLogger(__name__)

KEYS_FRESH_S = 2.0
"""How long the API keys read from the database answer requests before they are read again."""
KEYS_READ_AHEAD_S = KEYS_FRESH_S / 2
"""Keys older than this still answer, and a request that finds them so has them read again in
the background: a gateway asked at least this often never waits for that read."""


class KeyRecords(Store):
    """The store's API keys, kept hashed and read again every :data:`KEYS_FRESH_S`."""

    def __init__(self, database: Database) -> None:
        super().__init__(database)
        self._keys: tuple[tuple[str, str], ...] = ()
        self._keys_read_at = -math.inf
        self._keys_generation = 0
        """Raised by each key this store adds: a read begun before it is not kept as fresh."""
        self._keys_reading: asyncio.Task[object] | None = None

    async def close(self) -> None:
        if not self._closed and self._keys_reading is not None:
            self._keys_reading.cancel()
        await super().close()

    async def add_api_key(self, tenant: str, key: str) -> None:
        """Store a tenant's key, hashed. Adding the same pair again does nothing.

        Raises:
            ValueError: an empty tenant or key, or a key already given to another tenant.
        """
        if not tenant or not key:
            raise ValueError("an API key needs a non-empty tenant and key")
        key_hash = hash_api_key(key)
        await self._change(
            "INSERT INTO api_keys (key_hash, tenant, created_at) VALUES (:hash, :tenant, :now) "
            "ON CONFLICT DO NOTHING", hash=key_hash, tenant=tenant, now=utc_now())
        self._keys_read_at = -math.inf
        self._keys_generation += 1
        rows = await self._fetch("SELECT tenant FROM api_keys WHERE key_hash = :hash",
                                 hash=key_hash)
        if rows and rows[0]["tenant"] != tenant:
            raise ValueError(f"that API key already belongs to tenant {rows[0]['tenant']!r}")

    async def tenant_for_key(self, key: str) -> str | None:
        """The tenant owning this key, or None.

        Every stored hash is compared, each with ``hmac.compare_digest``, so the time taken
        does not depend on which key (if any) matched. Tenants have few keys; this is cheap.
        The keys are read from the database at most every :data:`KEYS_FRESH_S` (every request
        asks; a key another gateway adds is known here that much later), in the background
        once they are :data:`KEYS_READ_AHEAD_S` old.
        """
        candidate = hash_api_key(key)
        keys = self._keys
        age = time.monotonic() - self._keys_read_at
        if age > KEYS_FRESH_S:
            keys = await self._read_keys()
        elif age > KEYS_READ_AHEAD_S and self._keys_reading is None:
            self._keys_reading = asyncio.ensure_future(self._read_keys())
            self._keys_reading.add_done_callback(self._keys_read)
        found: str | None = None
        for key_hash, tenant in keys:
            if hmac.compare_digest(candidate, key_hash):
                found = tenant
        return found

    async def _read_keys(self) -> tuple[tuple[str, str], ...]:
        generation, began = self._keys_generation, time.monotonic()
        rows = await self._fetch("SELECT key_hash, tenant FROM api_keys")
        keys = tuple((str(row["key_hash"]), str(row["tenant"])) for row in rows)
        if generation == self._keys_generation:  # no key added meanwhile: keep it
            self._keys, self._keys_read_at = keys, began
        return keys

    def _keys_read(self, reading: asyncio.Task[object]) -> None:
        self._keys_reading = None
        if not reading.cancelled() and reading.exception() is not None:
            # The keys in hand answer until they are KEYS_FRESH_S old; a request then reads
            # them itself, and meets the error.
            logger.warning("could not read the API keys ahead: %s", reading.exception())

    async def list_tenants(self) -> list[str]:
        """Tenants that have at least one key, sorted."""
        rows = await self._fetch("SELECT DISTINCT tenant FROM api_keys ORDER BY tenant")
        return [str(row["tenant"]) for row in rows]
