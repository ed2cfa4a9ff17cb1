"""The store's core and the sessions' records (common.store), on real SQLite files and
(REPLGATE_TEST_DATABASE=postgresql) a real PostgreSQL."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import pytest

from common.database import StoreError
from common.store import RecordExists, RecordNotFound, SessionRecord, Store
from kernel_pool import SandboxInfo


@pytest.fixture
async def store(database_target: str | Path) -> AsyncIterator[Store]:
    """The run's kind of database: SQLite, or PostgreSQL in the database leg."""
    async with Store.open(database_target) as opened:
        yield opened


def _sandbox() -> SandboxInfo:
    return SandboxInfo(sandbox_id="sb1", backend="docker", profile="default",
                       container_id="c0ffee", workspace="/ws/sb1", socket_dir="/run/sb1")


async def test_open_creates_folder_and_wal_database(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "db.sqlite"
    store = await Store.open(path)
    try:
        assert path.is_file()
        with contextlib.closing(sqlite3.connect(path)) as raw:
            assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        await store.close()
    await store.close()  # idempotent


async def test_open_refuses_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    with sqlite3.connect(path) as raw:
        raw.execute("PRAGMA user_version=99")
    raw.close()
    with pytest.raises(StoreError, match="schema version 99"):
        await Store.open(path)


async def test_create_session_round_trips_json_columns(store: Store) -> None:
    record = SessionRecord(id="s1", tenant="acme", profile="default", status="idle",
                           metadata={"agent": "x", "n": [1, 2]}, env={"A": "1"},
                           sandbox=_sandbox())
    await store.create_session(record)
    got = await store.get_session("s1")
    assert got == record
    assert isinstance(got.sandbox, SandboxInfo)
    datetime.fromisoformat(got.created_at)


async def test_create_session_refuses_duplicate_id(store: Store) -> None:
    await store.create_session(SessionRecord(id="s1", tenant="acme", profile="default"))
    with pytest.raises(RecordExists):
        await store.create_session(SessionRecord(id="s1", tenant="other", profile="default"))


async def test_update_session_writes_only_named_fields(store: Store) -> None:
    await store.create_session(SessionRecord(id="s1", tenant="acme", profile="default",
                                             sandbox=_sandbox()))
    updated = await store.update_session("s1", status="busy", execution_count=3, sandbox=None)
    assert (updated.status, updated.execution_count, updated.sandbox) == ("busy", 3, None)
    assert await store.get_session("s1") == updated


async def test_update_session_refuses_unknown_field_and_bad_value(store: Store) -> None:
    await store.create_session(SessionRecord(id="s1", tenant="acme", profile="default"))
    with pytest.raises(ValueError, match="nope"):
        await store.update_session("s1", nope=1)
    with pytest.raises(ValueError):
        await store.update_session("s1", id="s2")
    with pytest.raises(ValueError):
        await store.update_session("s1", execution_count=-1)


async def test_update_session_missing_raises_not_found(store: Store) -> None:
    with pytest.raises(RecordNotFound):
        await store.update_session("ghost", status="idle")


async def test_list_sessions_filters_tenant_and_deleted(store: Store) -> None:
    for sid, tenant in [("a1", "a"), ("a2", "a"), ("b1", "b")]:
        await store.create_session(SessionRecord(id=sid, tenant=tenant, profile="default"))
    await store.mark_deleted("a2")
    assert [s.id for s in await store.list_sessions(tenant="a")] == ["a1"]
    assert [s.id for s in await store.list_sessions(tenant="a", include_deleted=True)] == [
        "a1", "a2"]
    assert {s.id for s in await store.list_sessions()} == {"a1", "b1"}
    deleted = await store.get_session("a2")
    assert deleted is not None and deleted.deleted
    with pytest.raises(RecordNotFound):
        await store.mark_deleted("ghost")
