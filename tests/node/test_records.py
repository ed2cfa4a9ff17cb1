"""Sessions' records as a gateway of many machines reads them, on the real PostgreSQL: kept
while its notices come, read again once another gateway moved or deleted the session, and
never kept while nothing listens."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from common.store import SessionRecord, Store
from node.records import SessionRecords
from node.registry import Registry
from tests.conftest import create_database, drop_database


@pytest.fixture
async def stores() -> AsyncIterator[tuple[Store, Store]]:
    """Two gateways' stores on one new PostgreSQL database."""
    url = create_database()
    try:
        async with Store.open(url) as mine, Store.open(url) as theirs:
            yield mine, theirs
    finally:
        drop_database(url)


async def _until(check: object, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "no notice came"
        await asyncio.sleep(0.01)


async def test_a_record_is_kept_until_another_gateway_moves_or_deletes_it(
        stores: tuple[Store, Store]) -> None:
    mine, theirs = stores
    await theirs.create_session(SessionRecord(id="s1", tenant="acme", profile="default",
                                              node="n1", epoch=1))
    placed = 1
    records = SessionRecords(mine)
    listening = asyncio.create_task(records.listen())
    try:
        await _until(lambda: records.listening)
        first = await records.get("s1")
        assert first is not None and first.node == "n1" and first.epoch == placed
        assert await records.get("s1") is first  # kept: no read

        # Another gateway places it on another node: the notice makes this one read again.
        assert await Registry(theirs.database).move("s1", "n2", placed) == placed + 1
        await _until(lambda: "s1" not in records._kept)
        moved = await records.get("s1")
        assert moved is not None and (moved.node, moved.epoch) == ("n2", placed + 1)

        await theirs.mark_deleted("s1")
        await _until(lambda: "s1" not in records._kept)
        gone = await records.get("s1")
        assert gone is not None and gone.deleted
    finally:
        listening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await listening


async def test_nothing_is_kept_while_nobody_listens(stores: tuple[Store, Store]) -> None:
    mine, theirs = stores
    await theirs.create_session(SessionRecord(id="s2", tenant="acme", profile="default"))
    records = SessionRecords(mine)
    first = await records.get("s2")
    assert await Registry(theirs.database).move("s2", "n1", 0) == 1
    again = await records.get("s2")
    assert first is not None and first.node is None
    assert again is not None and again.node == "n1"
