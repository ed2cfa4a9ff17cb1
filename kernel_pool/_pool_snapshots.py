"""Saved snapshots (E2B's ``create_snapshot``): a session's variables and files written as a
bundle under a snapshot id, while it goes on; new sessions made from one, each its own copy.

A snapshot is what a pause keeps (the kernel's variables, never its processes), written as a
paused session's bundle is (:mod:`kernel_pool.bundles`), in the pool's
:attr:`PoolSnapshots.snapshot_bundles`: a folder of the state directory on one machine, the
shared bundle store on nodes (any node makes sessions from any snapshot). A session made
from one is a restore of that bundle under a new id: paused, it resumes with the variables at
its first use. Nothing of it refers to the snapshot afterwards: deleting the snapshot leaves
the sessions made from it as they are.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable
from typing import Any

import anyio.to_thread
from pydantic import SecretStr

from kernel_pool._forks import Forks
from kernel_pool._session import Session
from kernel_pool.bundles import (
    BundleInfo,
    BundleNotFound,
    Bundles,
    FileStore,
    read_session,
    write_session,
)
from kernel_pool.bundles._session import holds_variables, read_files
from kernel_pool.config import BundleSettings, PoolSettings
from kernel_pool.exceptions import SnapshotError, SnapshotNotFound
from kernel_pool.state import SnapshotSaved

SAVED_FOLDER = "saved-snapshots"
"""The state directory's folder of saved snapshots, where no shared bundle store is set."""
FILES_ALONE = "variables"
"""The ``not_kept`` entry of a snapshot that keeps the files alone."""
PROCESSES = "processes"
"""The ``not_kept`` entry every snapshot has: no running process is kept."""


class PoolSnapshots(Forks):
    """Take saved snapshots of sessions, make sessions from them, delete them."""

    def __init__(self, settings: PoolSettings, *args: Any, **kwargs: Any) -> None:
        super().__init__(settings, *args, **kwargs)
        self.snapshot_bundles: Bundles | None = Bundles(
            FileStore(settings.state_dir / SAVED_FOLDER), None)
        """Where saved snapshots are kept: the state directory (one machine), or the shared
        bundle store a node or gateway sets here; None where none can be (a node without a
        bundle store), and snapshots are refused."""

    def keep_snapshots_in(self, store: str, key: str | None) -> None:
        """Keep saved snapshots in the bundle store ``store`` (``s3://`` or ``file://``,
        sealed with ``key``), which other gateways or nodes share, rather than in the state
        directory."""
        self.snapshot_bundles = Bundles.from_settings(BundleSettings(
            store=store, key=SecretStr(key) if key is not None else None))

    def _saved(self) -> Bundles:
        if self.snapshot_bundles is None:
            raise SnapshotError("snapshots need a bundle store that every node reaches: set "
                                "REPLGATE_BUNDLE_STORE on the nodes")
        return self.snapshot_bundles

    async def snapshot_session(self, session_id: str, snapshot_id: str, *, tenant: str,
                               memory: bool = True) -> SnapshotSaved:
        """Save the session (running or paused) as snapshot ``snapshot_id`` of ``tenant``:
        its variables (unless ``memory`` is False) and files. It goes on unchanged; its
        variables are those of the moment the snapshot began, its files those of the write
        that follows."""
        bundles = self._saved()
        session = self.get_session(session_id)
        not_kept = {PROCESSES: "a snapshot keeps no running process: commands, threads and "
                               "other kernels start afresh in the sessions made from it"}
        kept: list[str] = []
        if memory:
            info = (await session.snapshot(snapshot_id)).without_memory()
            kept, not_kept = info.kept, {**info.not_kept, **not_kept}
        else:
            not_kept[FILES_ALONE] = ("a filesystem snapshot keeps the files alone: the "
                                     "sessions made from it start on a fresh kernel")
        try:
            digest = await self.backend.image_digest(session.profile.image)
            size = await write_session(
                bundles, tenant, snapshot_id,
                BundleInfo(paused_with="variables", image_digest=digest or session.profile.image,
                           kept=kept, not_kept=not_kept),
                self.snapshots if memory else None, session.workspace)
        finally:
            if memory:
                await anyio.to_thread.run_sync(self.snapshots.delete, snapshot_id)
        return SnapshotSaved(snapshot_id=snapshot_id, session_id=session.id,
                             profile=session.profile.name, env=session.env, memory=memory,
                             kept=kept, not_kept=not_kept, size_bytes=size)

    async def delete_snapshot(self, tenant: str, snapshot_id: str) -> None:
        """Remove a saved snapshot; sessions made from it are not touched. Nothing to remove
        is no error."""
        await self._saved().delete(tenant, snapshot_id)

    async def create_from_snapshot(self, snapshot_id: str, *, tenant: str, profile: str,
                                   env: dict[str, str] | None = None,
                                   metadata: dict[str, Any] | None = None,
                                   admitted: Awaitable[None] | None = None,
                                   session_id: str | None = None) -> Session:
        """A copy of saved snapshot ``snapshot_id`` of ``tenant`` as a new session: paused,
        resuming with its variables at first use (a snapshot of files alone: on a warm kernel,
        its files copied in). :class:`SnapshotNotFound` when the tenant has no such
        snapshot; ``admitted``: see :meth:`create_session`."""
        try:
            bundle = await self._saved().open(tenant, snapshot_id)
        except BundleNotFound:
            raise SnapshotNotFound(snapshot_id) from None
        if not holds_variables(bundle):
            session = await self.create_session(profile, env=env, metadata=metadata,
                                                session_id=session_id, tenant=tenant,
                                                admitted=admitted)
            try:
                await read_files(bundle, session.workspace)
            except BaseException:
                await self._close_session(session, "its snapshot could not be read")
                raise
            return session
        if admitted is not None:
            await admitted
        new_id = session_id or str(uuid.uuid4())
        try:
            return await self.restore_session(
                lambda workspace: read_session(bundle, new_id, self.snapshots, workspace),
                session_id=new_id, profile=profile, env=env, metadata=metadata,
                tenant=tenant)
        except BundleNotFound:  # deleted while it was read
            raise SnapshotNotFound(snapshot_id) from None
