"""Executions through the port: events in order, counts, state kept, the queue's order, gates,
interrupts, timeouts, cancellation and refusals, the same wherever the session runs."""

from __future__ import annotations

import asyncio

import pytest

from kernel_pool import (
    DoneEvent,
    Event,
    ExecutionHandle,
    ExecutionStatus,
    InvalidRequest,
    QueueFull,
    SessionClosed,
    SessionHost,
    SessionPort,
    SessionStatus,
    StreamEvent,
)
from tests.contract.support import MAX_QUEUED


async def test_code_runs_streams_in_order_and_keeps_its_state(session: SessionPort) -> None:
    seen: list[tuple[str, Event | None]] = []
    session.listeners.append(lambda _s, handle, event: seen.append((handle.id, event)))
    first = await session.submit("import os\nx = 40\nprint(os.environ['GREETING'])").result()
    handle = session.submit("import time\nfor i in range(3):\n    print(i, flush=True)\n"
                            "    time.sleep(0.2)\nx + 2")
    events = [event async for event in handle.stream()]
    result = await handle.result()

    assert first.status is ExecutionStatus.OK and first.stdout == "hi\n"
    assert result.status is ExecutionStatus.OK and result.stdout == "0\n1\n2\n"
    assert result.outputs[-1].data["text/plain"] == "42"
    streamed = [e for e in events if isinstance(e, StreamEvent)]
    assert len(streamed) >= 2, "the prints arrived as they happened, not as one at the end"
    assert isinstance(events[-1], DoneEvent) and events[-1].execution_count == 2
    assert [e for e in events if isinstance(e, DoneEvent)] == [events[-1]], "done comes once"
    assert (first.execution_count, result.execution_count) == (1, 2)
    assert session.state().execution_count == 2
    heard = [event for hid, event in seen if hid == handle.id]
    assert heard[0] is None and heard[1:] == events, \
        "listeners hear the start (None), then every event the handle streams"


async def test_executions_run_in_the_order_they_were_submitted(session: SessionPort) -> None:
    handles = [session.submit(f"import time\ntime.sleep(0.{3 - i})\nprint({i})")
               for i in range(MAX_QUEUED)]
    results = [await handle.result() for handle in handles]

    assert [r.stdout for r in results] == [f"{i}\n" for i in range(MAX_QUEUED)]
    assert [r.execution_count for r in results] == list(range(1, MAX_QUEUED + 1))


async def test_a_gate_holds_the_queue_and_interrupt_withdraws_the_held(
        session: SessionPort) -> None:
    released = asyncio.Event()

    async def hold(handle: ExecutionHandle, emit: object) -> None:
        await released.wait()

    held = session.submit("print('held')", gate=hold)
    after = session.submit("print('after')")
    await asyncio.sleep(0.5)
    assert held.done is None and after.done is None, "nothing passes a held execution"
    assert await session.interrupt() is True
    withdrawn = await held.result()
    ran = await after.result()

    assert withdrawn.status is ExecutionStatus.INTERRUPTED and withdrawn.stdout == ""
    assert ran.status is ExecutionStatus.OK and ran.stdout == "after\n"


async def test_a_gate_that_lets_code_pass_runs_it(session: SessionPort) -> None:
    asked: list[str] = []

    async def allow(handle: ExecutionHandle, emit: object) -> None:
        asked.append(handle.code)

    result = await session.submit("print('passed')", gate=allow).result()

    assert asked == ["print('passed')"] and result.stdout == "passed\n"


async def test_interrupt_stops_running_code_and_the_state_stays(session: SessionPort) -> None:
    await session.submit("kept = 'yes'").result()
    handle = session.submit("import time\nprint('go', flush=True)\ntime.sleep(60)")
    async for event in handle.stream():
        if isinstance(event, StreamEvent):
            break
    current = session.current
    assert current is not None and current.id == handle.id
    assert session.pending == 1 and session.state().status is SessionStatus.BUSY
    assert await session.interrupt() is True
    result = await handle.result()

    assert result.status is ExecutionStatus.INTERRUPTED, result
    assert not result.restarted, result.reason
    assert (await session.submit("print(kept)").result()).stdout == "yes\n"
    assert session.current is None and session.pending == 0


async def test_interrupt_with_nothing_running_is_false(session: SessionPort) -> None:
    assert await session.interrupt() is False


async def test_a_timeout_stops_the_code_and_says_so(session: SessionPort) -> None:
    await session.submit("kept = 1").result()
    result = await session.submit("import time\ntime.sleep(60)", timeout_s=1).result()

    assert result.status is ExecutionStatus.TIMEOUT, result
    assert (await session.submit("print(kept + 1)").result()).stdout == "2\n"


async def test_a_timeout_out_of_bounds_is_refused_at_submit(session: SessionPort) -> None:
    with pytest.raises(InvalidRequest, match="timeout_s must be above 0"):
        session.submit("1", timeout_s=10_000)
    with pytest.raises(InvalidRequest, match="timeout_s must be above 0"):
        session.submit("1", timeout_s=0)


async def test_a_full_queue_refuses_the_next_submission(session: SessionPort) -> None:
    """Executions waiting, the running one among them, are bounded (max_queued_executions):
    the next is refused as QueueFull at once, and the queue runs on."""
    handles = [session.submit("import time\ntime.sleep(1)") for _ in range(MAX_QUEUED)]
    with pytest.raises(QueueFull, match=f"already has {MAX_QUEUED} executions waiting"):
        session.submit("print('one too many')")
    results = [await handle.result() for handle in handles]

    assert [r.status for r in results] == [ExecutionStatus.OK] * MAX_QUEUED
    assert (await session.submit("print('room again')").result()).stdout == "room again\n"


async def test_an_awaiter_that_goes_away_leaves_the_execution_running(
        session: SessionPort) -> None:
    handle = session.submit("import time\ntime.sleep(1)\nprint('finished')")
    waiting = asyncio.ensure_future(handle.result())
    await asyncio.sleep(0.2)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    result = await asyncio.wait_for(handle.result(), 30)

    assert result.status is ExecutionStatus.OK and result.stdout == "finished\n"


async def test_an_error_in_the_code_is_its_result_not_a_raise(session: SessionPort) -> None:
    result = await session.submit("1 / 0").result()

    assert result.status is ExecutionStatus.ERROR and result.error is not None
    assert result.error.ename == "ZeroDivisionError"
    assert (await session.submit("print('still here')").result()).stdout == "still here\n"


async def test_raw_jupyter_requests_are_relayed_until_idle(session: SessionPort) -> None:
    await session.submit("value_one = 1").result()
    seen = [(channel, msg) async for channel, msg in session.relay(
        "kernel_info_request", {}, channel="control")]
    kinds = [(channel, msg["msg_type"]) for channel, msg in seen]

    assert ("control", "kernel_info_reply") in kinds
    # The reply and the idle status come on two sockets, in either order.
    assert {"execution_state": "idle"} in [m["content"] for c, m in seen if c == "iopub"]
    info = next(msg for _, msg in seen if msg["msg_type"] == "kernel_info_reply")
    assert info["content"]["language_info"]["name"] == "python"
    assert all(isinstance(msg["buffers"], list) for _, msg in seen)
    replies = [msg async for channel, msg in session.relay(
        "complete_request", {"code": "value_o", "cursor_pos": 7}) if channel == "shell"]
    assert len(replies) == 1 and "value_one" in replies[0]["content"]["matches"]


async def test_every_call_to_a_deleted_session_says_it_is_closed(host: SessionHost) -> None:
    closed = await host.create_session()
    await host.delete_session(closed.id)

    assert closed.closed
    with pytest.raises(SessionClosed, match=f"session {closed.id} is closed"):
        closed.submit("1")
    with pytest.raises(SessionClosed):
        async for _ in closed.relay("kernel_info_request", {}):
            pass
    with pytest.raises(SessionClosed):
        await closed.list_files()
    with pytest.raises(SessionClosed):
        await closed.write_file("late.txt", b"y")
    with pytest.raises(SessionClosed):
        await closed.run_command("ls")
    with pytest.raises(SessionClosed):
        await closed.usage()
