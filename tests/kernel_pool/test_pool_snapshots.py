"""Saved snapshots in the pool: refused where no bundle store can keep them, a failed write
leaves nothing behind and the session running, and the variables' copy a snapshot streams
from goes once it is written."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from kernel_pool import KernelPool, Session, SessionStatus, SnapshotError
from kernel_pool.bundles import BundleStoreError


def _snapshot_id() -> str:
    return f"snap_{secrets.token_hex(8)}"


def _left(pool: KernelPool, snapshot_id: str) -> list[Path]:
    return sorted(pool.snapshots.root.glob(f"{snapshot_id}*"))


async def test_a_pool_without_a_bundle_store_refuses_snapshots_with_a_sentence(
        pool: KernelPool, shared_session: Session) -> None:
    kept, pool.snapshot_bundles = pool.snapshot_bundles, None
    try:
        with pytest.raises(SnapshotError, match="set REPLGATE_BUNDLE_STORE on the nodes"):
            await pool.snapshot_session(shared_session.id, _snapshot_id(), tenant="t")
        with pytest.raises(SnapshotError, match="REPLGATE_BUNDLE_STORE"):
            await pool.create_from_snapshot(_snapshot_id(), tenant="t", profile="default")
    finally:
        pool.snapshot_bundles = kept


async def test_a_failed_write_leaves_nothing_and_the_session_running(
        pool: KernelPool, shared_session: Session, tmp_path: Path) -> None:
    kept = pool.snapshot_bundles
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the store's folder would be")
    pool.keep_snapshots_in(blocked.as_uri(), None)
    snapshot_id = _snapshot_id()
    try:
        await shared_session.submit("z = 'still here'").result()
        with pytest.raises(BundleStoreError):
            await pool.snapshot_session(shared_session.id, snapshot_id, tenant="t")
    finally:
        pool.snapshot_bundles = kept
    assert _left(pool, snapshot_id) == []
    assert shared_session.state().status is not SessionStatus.PAUSED
    assert (await shared_session.submit("print(z)").result()).stdout == "still here\n"


async def test_the_variables_copy_goes_once_the_snapshot_is_written(
        pool: KernelPool, shared_session: Session) -> None:
    snapshot_id = _snapshot_id()
    await shared_session.submit("w = list(range(5))").result()
    saved = await pool.snapshot_session(shared_session.id, snapshot_id, tenant="t")
    try:
        assert "w" in saved.kept and _left(pool, snapshot_id) == []
        assert pool.snapshot_bundles is not None
        assert await pool.snapshot_bundles.exists("t", snapshot_id)
    finally:
        await pool.delete_snapshot("t", snapshot_id)
    assert pool.snapshot_bundles is not None
    assert not await pool.snapshot_bundles.exists("t", snapshot_id)
