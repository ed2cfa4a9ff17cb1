"""Timeouts that really stop code: interrupt first, then kill the sandbox's processes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from kp_support import processes, run_ok

from kernel_pool import KernelPool, Session

SIGINT_IGNORED_LOOP = """
import signal
signal.signal(signal.SIGINT, signal.SIG_IGN)
while True:
    pass
"""


@pytest.fixture(scope="module")
async def timeout_session(pool: KernelPool) -> AsyncIterator[Session]:
    """One session for this module: every test leaves it usable (that is what they check)."""
    session = await pool.create_session()
    yield session
    await pool.delete_session(session.id)


async def test_timeout_interrupts_python_loop_keeping_state(timeout_session: Session) -> None:
    await run_ok(timeout_session, "kept = 'still here'")
    started = time.monotonic()
    result = await timeout_session.execute("while True:\n    pass", timeout_s=2)
    elapsed = time.monotonic() - started
    assert result.status == "timeout"
    assert result.restarted is False
    assert result.error is not None and result.error.ename == "KeyboardInterrupt"
    assert result.reason is not None and "timeout_s=2" in result.reason
    assert 2 <= elapsed < 4
    assert result.metrics.cpu_time_ms is not None and result.metrics.cpu_time_ms > 100
    assert await run_ok(timeout_session, "print(kept)") == "still here\n"


async def test_timeout_restarts_kernel_when_sigint_ignored(timeout_session: Session) -> None:
    await run_ok(timeout_session, "lost = 1\nopen('survivor.txt', 'w').write('kept')")
    started = time.monotonic()
    result = await timeout_session.execute(SIGINT_IGNORED_LOOP, timeout_s=2)
    elapsed = time.monotonic() - started
    assert result.status == "timeout"
    assert result.restarted is True
    assert result.execution_count is None
    assert result.reason is not None and "killed" in result.reason
    assert elapsed < 2 + 1.0 + 15  # timeout, grace, then a kernel start
    # The CPU the runaway burnt before the kill is still accounted.
    assert result.metrics.cpu_time_ms is not None and result.metrics.cpu_time_ms > 100

    after = await timeout_session.execute("lost")
    assert after.status == "error" and after.error is not None
    assert after.error.ename == "NameError"
    assert after.execution_count == 1, "execution_count starts again after a restart"
    assert await run_ok(timeout_session, "print(open('survivor.txt').read())") == "kept\n"


async def test_hard_timeout_kills_setsid_children(timeout_session: Session) -> None:
    result = await timeout_session.execute(
        "import subprocess\n"
        "daemon = subprocess.Popen(['sleep', '1000'], start_new_session=True)\n"
        + SIGINT_IGNORED_LOOP, timeout_s=2)
    assert result.status == "timeout" and result.restarted is True
    left = [p for p in await processes(timeout_session) if p[2] == "sleep 1000"]
    assert left == []


async def test_timeout_stops_output_flood_keeping_state(timeout_session: Session) -> None:
    await run_ok(timeout_session, "flood_kept = 'yes'")
    started = time.monotonic()
    result = await timeout_session.execute("while True:\n    print('f' * 10_000)", timeout_s=2)
    assert time.monotonic() - started < 6, "a flood must not delay the timeout"
    assert result.status == "timeout"
    assert result.restarted is False
    assert result.truncated is True
    assert await run_ok(timeout_session, "print(flood_kept)") == "yes\n"


async def test_interrupt_stops_running_execution(timeout_session: Session) -> None:
    assert await timeout_session.interrupt() is False, "nothing runs: nothing to interrupt"
    await run_ok(timeout_session, "survives = 7")
    handle = timeout_session.submit("import time\nprint('sleeping', flush=True)\n"
                                    "time.sleep(60)", timeout_s=90)
    async for event in handle.stream():
        if event.type == "stdout":
            break
    started = time.monotonic()
    assert await timeout_session.interrupt() is True
    result = await asyncio.wait_for(handle.result(), 10)
    assert time.monotonic() - started < 3
    assert result.status == "interrupted"
    assert result.restarted is False, result.reason
    assert await run_ok(timeout_session, "print(survives)") == "7\n"


async def test_interrupt_stops_output_flood(timeout_session: Session) -> None:
    handle = timeout_session.submit("while True:\n    print('i' * 100_000)", timeout_s=60)
    async for event in handle.stream():
        if event.type == "stdout":
            break
    await asyncio.sleep(0.5)  # the flood is in full swing: the host's queue is full
    started = time.monotonic()
    assert await timeout_session.interrupt() is True
    result = await asyncio.wait_for(handle.result(), 20)
    assert time.monotonic() - started < 3
    assert result.status == "interrupted"
    assert result.restarted is False


async def test_restart_clears_variables_and_keeps_files(timeout_session: Session) -> None:
    await run_ok(timeout_session, "gone = 1\nwith open('restart.txt', 'w') as f:\n"
                                  "    f.write('kept')")
    await timeout_session.restart()
    assert timeout_session.execution_count == 0
    result = await timeout_session.execute("gone")
    assert result.error is not None and result.error.ename == "NameError"
    assert await run_ok(timeout_session, "print(open('restart.txt').read())") == "kept\n"
