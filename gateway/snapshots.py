"""Saved snapshots, the use cases: a tenant's session saved while it goes on, sessions made from
a snapshot, snapshots listed and deleted, within the tenant's quotas (``docs/snapshots.md``).

The host writes and reads the snapshot itself (:meth:`SessionHost.snapshot_session`, a bundle
in the bundle store); the database keeps its record (:mod:`gateway.records.snapshots`), which
says whose it is and counts it against ``REPLGATE_MAX_SNAPSHOTS_PER_TENANT`` and
``REPLGATE_MAX_SNAPSHOT_BYTES_PER_TENANT``. A session made from one is the tenant's like any
other (the same limits, records and audit), and holds nothing of the snapshot: deleting the
snapshot leaves it as it is.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from common.store import SessionRecord
from gateway.errors import InvalidInput, TooManyRequests
from gateway.records.snapshots import SnapshotRecord
from gateway.service import Gateway
from kernel_pool import KernelPoolError, SessionPort, SnapshotNotFound, parse_size

logger = logging.getLogger(__name__)

ID_PREFIX = "snap_"
"""A snapshot's id starts so (never a session's, a profile's or a name's: names may not)."""
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""A snapshot's name: letters, digits, ``.``, ``_``, ``-``; at most 128 characters."""


class Snapshots:
    """The tenants' saved snapshots, on the gateway's host and in its store."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.store = gateway.store
        self.host = gateway.pool
        self._taking: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        """One snapshot at a time per tenant on this gateway: its quota is counted, then
        spent (gateways sharing a database may each pass it once at the same moment)."""

    # -- taking and deleting -----------------------------------------------------------------

    async def take(self, tenant: str, session_id: str, *, name: str | None = None,
                   memory: bool = True) -> SnapshotRecord:
        """Save the tenant's session (it goes on unchanged) as a new snapshot, ``name``d if
        given (a snapshot of the tenant with that name is replaced by this one)."""
        if name is not None:
            self._check_name(name)
        session = await self.gateway.session(tenant, session_id)
        self.gateway.check_disk()
        settings = self.gateway.settings
        limit = parse_size(settings.max_snapshot_bytes_per_tenant)
        async with self._taking[tenant]:
            count, used = await self.store.snapshot_usage(tenant)
            if count >= settings.max_snapshots_per_tenant:
                raise TooManyRequests(
                    f"tenant {tenant!r} has {count} snapshots, the most it may keep; delete "
                    "some or raise REPLGATE_MAX_SNAPSHOTS_PER_TENANT")
            if used >= limit:
                raise TooManyRequests(self._too_large(tenant, used, limit))
            snapshot_id = ID_PREFIX + secrets.token_hex(12)
            saved = await self.host.snapshot_session(session.id, snapshot_id, tenant=tenant,
                                                     memory=memory)
            try:
                if used + saved.size_bytes > limit:
                    raise TooManyRequests(self._too_large(tenant, used + saved.size_bytes,
                                                          limit))
                replaced = (await self.store.named_snapshot(tenant, name)
                            if name is not None else None)
                if replaced is not None:
                    await self.delete(tenant, replaced.id)
                record = SnapshotRecord(
                    id=snapshot_id, tenant=tenant, name=name, session_id=session.id,
                    profile=saved.profile, env=saved.env, memory=saved.memory,
                    kept=saved.kept, not_kept=saved.not_kept, size_bytes=saved.size_bytes,
                    created_at=datetime.now(UTC))
                await self.store.add_snapshot(record)
            except BaseException:
                await asyncio.shield(self.host.delete_snapshot(tenant, snapshot_id))
                raise
        logger.info("snapshot %s of session %s saved (%d bytes)", snapshot_id, session.id,
                    saved.size_bytes)
        return record

    def _check_name(self, name: str) -> None:
        if not NAME.fullmatch(name) or name.startswith(ID_PREFIX):
            raise InvalidInput(f"snapshot name {name!r}: 1 to 128 letters, digits, '.', '_' "
                               f"or '-', starting with a letter or digit, not with "
                               f"{ID_PREFIX!r}")
        if name in {profile.name for profile in self.gateway.profiles()}:
            raise InvalidInput(f"snapshot name {name!r} is a profile's: choose another")

    @staticmethod
    def _too_large(tenant: str, used: int, limit: int) -> str:
        return (f"tenant {tenant!r}'s snapshots would take {used} bytes, over "
                f"REPLGATE_MAX_SNAPSHOT_BYTES_PER_TENANT ({limit} bytes); delete some or "
                "raise it")

    async def delete(self, tenant: str, snapshot_id: str) -> bool:
        """Remove the tenant's snapshot (the sessions made from it go on); False when it has
        none of that id. Its bundle goes first: a failure of the store leaves it listed, to
        delete again."""
        if await self.store.get_snapshot(tenant, snapshot_id) is None:
            return False
        await self.host.delete_snapshot(tenant, snapshot_id)
        return await self.store.delete_snapshot_record(tenant, snapshot_id)

    # -- reading -----------------------------------------------------------------------------

    async def get(self, tenant: str, reference: str) -> SnapshotRecord:
        """The tenant's snapshot of that id or name; :class:`SnapshotNotFound` otherwise."""
        found = await self.find(tenant, reference)
        if found is None:
            raise SnapshotNotFound(reference)
        return found

    async def find(self, tenant: str, reference: str) -> SnapshotRecord | None:
        """The tenant's snapshot of that id or name, or None."""
        if reference.startswith(ID_PREFIX):
            return await self.store.get_snapshot(tenant, reference)
        return await self.store.named_snapshot(tenant, reference)

    async def list(self, tenant: str, *, name: str | None = None,
                   session_id: str | None = None) -> list[SnapshotRecord]:
        """The tenant's snapshots, newest first: all, of a name, or taken of a session."""
        return await self.store.list_snapshots(tenant, name=name, session_id=session_id)

    # -- sessions made from them -------------------------------------------------------------

    async def start_session(self, tenant: str, snapshot: SnapshotRecord, *,
                            env: dict[str, str] | None = None,
                            metadata: dict[str, Any] | None = None) -> SessionPort:
        """A new session of the tenant, a copy of the snapshot (its variables come back at the
        session's first use), with the snapshot's environment and ``env`` over it."""
        self.gateway.check_disk()
        held = await self.host.count_sessions(tenant)
        limit = self.gateway.settings.max_sessions_per_tenant
        if held >= limit:
            raise TooManyRequests(
                f"tenant {tenant!r} already has {limit} sessions; delete some or raise "
                "REPLGATE_MAX_SESSIONS_PER_TENANT")
        env = {**snapshot.env, **(env or {})}
        session = await self.host.create_from_snapshot(
            snapshot.id, tenant=tenant, profile=snapshot.profile, env=env,
            metadata=metadata or {})
        state = session.state()
        try:
            await self.store.create_session(SessionRecord(
                id=session.id, tenant=tenant, profile=snapshot.profile,
                status=state.status.value, created_at=state.created_at,
                last_active_at=state.last_active_at, execution_count=0,
                metadata=state.metadata, env=env, sandbox=state.sandbox.model_dump(mode="json"),
                node=state.node, epoch=self.host.first_epoch))
            await self.gateway.session(tenant, session.id)  # the tenant's from now on
        except BaseException:
            try:
                await asyncio.shield(self.host.delete_session(session.id))
            except KernelPoolError as exc:
                logger.warning("session %s made from snapshot %s not removed: %s",
                               session.id, snapshot.id, exc)
            raise
        return session
