"""The gateway's store (history, keys; sessions are tests/common/test_session_store.py's),
on real SQLite files and (REPLGATE_TEST_DATABASE=postgresql) a real PostgreSQL."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from common.store import RecordExists, RecordNotFound, SessionRecord
from gateway.records import keys as store_module
from gateway.records.executions import ExecutionRecord
from gateway.store import Store
from kernel_pool import (
    DisplayEvent,
    DoneEvent,
    Execution,
    ExecutionStatus,
    StreamEvent,
)


@pytest.fixture
async def store(database_target: str | Path) -> AsyncIterator[Store]:
    """The run's kind of database: SQLite, or PostgreSQL in the database leg."""
    async with Store.open(database_target) as opened:
        yield opened


def _events() -> list[StreamEvent | DisplayEvent | DoneEvent]:
    return [
        StreamEvent(type="stdout", text="hi\n"),
        DisplayEvent(type="result", data={"text/plain": "2"}),
        DoneEvent(status=ExecutionStatus.OK, execution_count=1, duration_ms=3.5),
    ]


async def test_start_execution_assigns_seq_per_session(store: Store) -> None:
    starts = await asyncio.gather(
        *(store.start_execution(f"e{i}", "s1", "acme", f"x = {i}") for i in range(5)),
        store.start_execution("other", "s2", "acme", "pass"),
    )
    assert sorted(r.seq for r in starts[:5]) == [1, 2, 3, 4, 5]
    assert starts[5].seq == 1
    listed = await store.list_executions("s1")
    assert [r.seq for r in listed] == [1, 2, 3, 4, 5]
    assert all(r.status == "running" and r.result is None for r in listed)


async def test_start_execution_refuses_duplicate_id(store: Store) -> None:
    await store.start_execution("e1", "s1", "acme", "1")
    with pytest.raises(RecordExists):
        await store.start_execution("e1", "s1", "acme", "2")


async def test_start_execution_refuses_lone_surrogate(store: Store) -> None:
    with pytest.raises(ValueError, match="Unicode"):
        await store.start_execution("e1", "s1", "acme", "x = '\ud800'")


async def test_finish_execution_round_trips_events_and_result(store: Store) -> None:
    await store.start_execution("e1", "s1", "acme", "print('hi'); 1 + 1")
    events = _events()
    result = Execution.from_events(events)
    finished = await store.finish_execution("e1", ExecutionStatus.OK, 1, events, result)
    got = await store.get_execution("e1")
    assert got == finished
    assert isinstance(got, ExecutionRecord)
    assert got.status == "ok" and got.execution_count == 1 and got.finished_at is not None
    assert got.events == events
    assert got.result == result
    assert got.code == "print('hi'); 1 + 1"


async def test_finish_execution_accepts_dumped_dicts(store: Store) -> None:
    await store.start_execution("e1", "s1", "acme", "1")
    events = _events()
    await store.finish_execution(
        "e1", "ok", 1, [e.model_dump(mode="json") for e in events],
        Execution.from_events(events).model_dump(mode="json"))
    got = await store.get_execution("e1")
    assert got is not None and got.events == events


async def test_finish_execution_refuses_invalid_event(store: Store) -> None:
    await store.start_execution("e1", "s1", "acme", "1")
    with pytest.raises(ValueError):
        await store.finish_execution("e1", "ok", 1, [{"type": "bogus"}], None)


async def test_finish_execution_missing_raises_not_found(store: Store) -> None:
    with pytest.raises(RecordNotFound):
        await store.finish_execution("ghost", "ok", 1, [], None)


async def test_mark_unfinished_as_sets_only_running(store: Store) -> None:
    await store.start_execution("e1", "s1", "acme", "1")
    await store.start_execution("e2", "s1", "acme", "2")
    await store.finish_execution("e1", "ok", 1, [], None)
    assert await store.mark_unfinished_as("interrupted") == 1
    e1, e2 = await store.list_executions("s1")
    assert (e1.status, e2.status) == ("ok", "interrupted")
    assert e2.finished_at is not None
    assert await store.mark_unfinished_as("interrupted") == 0


async def test_get_missing_gives_none(store: Store) -> None:
    assert await store.get_session("ghost") is None
    assert await store.get_execution("ghost") is None
    assert await store.list_executions("ghost") == []


async def test_tenant_for_key_maps_two_tenants(store: Store) -> None:
    await store.add_api_key("alice", "rg_alice_key")
    await store.add_api_key("bob", "rg_bob_key")
    await store.add_api_key("bob", "rg_bob_key")  # again: a no-op
    assert await store.tenant_for_key("rg_alice_key") == "alice"
    assert await store.tenant_for_key("rg_bob_key") == "bob"
    assert await store.tenant_for_key("rg_wrong") is None
    assert await store.tenant_for_key("") is None
    assert await store.list_tenants() == ["alice", "bob"]


async def test_tenant_for_key_learns_another_stores_key_within_its_freshness(
        database_target: str | Path) -> None:
    """Keys are read at most every KEYS_FRESH_S: one added through another store (another
    gateway on the database) answers after that, one added through this store at once."""
    async with Store.open(database_target) as mine, Store.open(database_target) as theirs:
        assert await mine.tenant_for_key("rg_theirs") is None  # read now: none yet
        await theirs.add_api_key("carol", "rg_theirs")
        await mine.add_api_key("dave", "rg_mine")
        assert await mine.tenant_for_key("rg_mine") == "dave"
        await asyncio.sleep(store_module.KEYS_FRESH_S + 0.1)
        assert await mine.tenant_for_key("rg_theirs") == "carol"


async def test_tenant_for_key_reads_keys_ahead_in_the_background(
        database_target: str | Path) -> None:
    """Keys KEYS_READ_AHEAD_S old still answer, and are read again behind that answer: a key
    another store added meanwhile answers soon after, before KEYS_FRESH_S."""
    async with Store.open(database_target) as mine, Store.open(database_target) as theirs:
        read_at = time.monotonic()
        assert await mine.tenant_for_key("rg_theirs") is None  # read now: none yet
        await theirs.add_api_key("carol", "rg_theirs")
        await asyncio.sleep(store_module.KEYS_READ_AHEAD_S + 0.1)
        assert await mine.tenant_for_key("rg_theirs") is None  # the keys in hand answer
        for _ in range(300):  # (each call answers from the keys in hand, or the ones read)
            if await mine.tenant_for_key("rg_theirs") == "carol":
                break
            await asyncio.sleep(0.01)
        # Without a read ahead it would be learned only by a request's own read, past this.
        assert time.monotonic() - read_at < store_module.KEYS_FRESH_S


async def test_add_api_key_stores_only_hash(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    async with Store.open(path) as store:
        await store.add_api_key("alice", "rg_plaintext_secret")
    assert b"rg_plaintext_secret" not in path.read_bytes()
    with sqlite3.connect(path) as raw:
        (key_hash,) = raw.execute("SELECT key_hash FROM api_keys").fetchone()
    raw.close()
    assert len(key_hash) == 64


async def test_add_api_key_refuses_key_of_other_tenant(store: Store) -> None:
    await store.add_api_key("alice", "rg_shared")
    with pytest.raises(ValueError, match="alice"):
        await store.add_api_key("bob", "rg_shared")
    assert await store.tenant_for_key("rg_shared") == "alice"
    with pytest.raises(ValueError):
        await store.add_api_key("", "k")


async def test_reopen_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    async with Store.open(path) as store:
        await store.create_session(SessionRecord(id="s1", tenant="acme", profile="default"))
        await store.start_execution("e1", "s1", "acme", "1")
        await store.add_api_key("acme", "rg_k")
    async with Store.open(path) as store:
        assert await store.get_session("s1") is not None
        assert [r.id for r in await store.list_executions("s1")] == ["e1"]
        assert await store.tenant_for_key("rg_k") == "acme"


async def test_execution_taken_answers_without_a_thread_hop(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "db.sqlite")
    try:
        assert store.execution_taken("e1") is False
        await store.start_execution("e1", "s1", "acme", "1")
        assert store.execution_taken("e1") is True
        assert store.execution_taken("e2") is False
    finally:
        await store.close()
    assert store.execution_taken("e1") is None  # closed: the caller asks the usual way


async def test_executions_started_at_once_take_their_seq_in_the_order_asked(
        store: Store) -> None:
    """The gateway starts a session's recordings in submission order, without waiting for
    each: the history keeps that order."""
    await store.create_session(SessionRecord(id="s-order", tenant="t", profile="default"))
    ids = [f"e-order-{n:02d}" for n in range(30)]
    await asyncio.gather(*(store.start_execution(i, "s-order", "t", "pass") for i in ids))
    assert [r.id for r in await store.list_executions("s-order")] == ids
