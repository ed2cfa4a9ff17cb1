"""The Session's face: what a caller above kernel_pool may ask, all of it async."""

from __future__ import annotations

import asyncio

import pytest
from kp_support import run_ok

from kernel_pool import (
    FileMissing,
    FileTooLarge,
    KernelPool,
    PathOutsideWorkspace,
    Session,
    SessionClosed,
)


async def test_relay_kernel_info_yields_reply_then_ends_idle(shared_session: Session) -> None:
    seen = [(channel, msg["msg_type"]) async for channel, msg in shared_session.relay(
        "kernel_info_request", {}, channel="control")]

    # The reply and the idle status come on two sockets, in either order; the relay ends once
    # it has both.
    assert ("control", "kernel_info_reply") in seen
    assert ("iopub", "status") in seen
    assert seen[-1] in {("control", "kernel_info_reply"), ("iopub", "status")}


async def test_relay_complete_request_answers_from_the_kernel(shared_session: Session) -> None:
    await run_ok(shared_session, "relay_completion_target = 1")

    replies = [msg async for channel, msg in shared_session.relay(
        "complete_request", {"code": "relay_completion_t", "cursor_pos": 18})
        if channel == "shell"]

    assert len(replies) == 1
    assert "relay_completion_target" in replies[0]["content"]["matches"]


async def test_relay_on_closed_session_raises(pool: KernelPool) -> None:
    session = await pool.create_session()
    await pool.delete_session(session.id)

    with pytest.raises(SessionClosed):
        async for _ in session.relay("kernel_info_request", {}):
            pass


async def test_files_round_trip_through_the_workspace(shared_session: Session) -> None:
    written = await shared_session.write_file("api_test/data.bin", b"\x00\x01payload")

    assert written == 9
    assert await shared_session.read_file("api_test/data.bin", limit=100) == b"\x00\x01payload"
    listed = {f.path: f.size for f in await shared_session.list_files()}
    assert listed["api_test/data.bin"] == 9
    assert await run_ok(shared_session, "print(open('api_test/data.bin','rb').read()[2:])") \
        == "b'payload'\n"


async def test_read_file_refusals_are_named(shared_session: Session) -> None:
    await shared_session.write_file("api_test/big.bin", b"x" * 100)

    with pytest.raises(FileMissing):
        await shared_session.read_file("api_test/absent.bin", limit=100)
    with pytest.raises(FileTooLarge) as too_large:
        await shared_session.read_file("api_test/big.bin", limit=10)
    with pytest.raises(PathOutsideWorkspace):
        await shared_session.write_file("../escape.bin", b"no")
    assert (too_large.value.size, too_large.value.limit) == (100, 10)


async def test_sandbox_info_and_egress_attempts(shared_session: Session) -> None:
    info = shared_session.sandbox_info()

    assert info.backend == "docker" and info.container_id
    assert await shared_session.egress_attempts() == []  # the default profile has no network


async def test_interrupt_when_idle_is_false(shared_session: Session) -> None:
    assert await shared_session.interrupt() is False


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
