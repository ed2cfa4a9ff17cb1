"""The Session's face as a deletion meets its calls (the rest of what a caller above
kernel_pool may ask is tests/contract/'s, on a local pool and on a node alike)."""

from __future__ import annotations

import asyncio

import pytest

from kernel_pool import KernelPool, SessionClosed


async def test_usage_while_the_session_is_deleted_is_session_closed(pool: KernelPool) -> None:
    """A usage read that meets the deletion (its workspace removed under it) says the session
    is closed, never an OSError (the API fuzzing found it as a 500 on ``/metrics``)."""
    outcomes: set[str] = set()
    for _ in range(5):
        session = await pool.create_session()
        deleting = asyncio.ensure_future(pool.delete_session(session.id))
        while True:
            try:
                await session.usage()
            except SessionClosed:
                outcomes.add("closed")
                break
            outcomes.add("read")
        await deleting
    assert "closed" in outcomes, outcomes


async def test_workspace_calls_while_the_session_is_deleted_are_session_closed(
        pool: KernelPool) -> None:
    """A file call that meets the deletion says the session is closed (once it began, no call
    reaches the workspace, whose mount may be gone)."""
    session = await pool.create_session()
    await session.write_file("kept.txt", b"x")
    deleting = asyncio.ensure_future(pool.delete_session(session.id))
    for _ in range(100):  # a few turns of the loop: the deletion begins
        if session.closed:
            break
        await asyncio.sleep(0)
    assert session.closed
    with pytest.raises(SessionClosed):
        await session.list_files()
    with pytest.raises(SessionClosed):
        await session.write_file("late.txt", b"y")
    await deleting
