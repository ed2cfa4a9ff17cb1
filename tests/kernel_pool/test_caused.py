"""What an execution records for traces: its marks in time, and the lifecycle actions it caused
(real engine, real kernels); and a session's usage readings."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest
from kp_support import own_session, pausing_pool, run_ok

from kernel_pool import KernelPool, Session, parse_size


@pytest.fixture(scope="module")
async def pause_pool(state_root: Path, docker_client: docker.DockerClient,
                     ) -> AsyncIterator[KernelPool]:
    async with pausing_pool(state_root, docker_client, "caused", pause_with="variables") as pool:
        yield pool


@pytest.fixture
async def session(pause_pool: KernelPool) -> AsyncIterator[Session]:
    async with own_session(pause_pool) as own:
        yield own


async def test_execution_marks_its_queue_run_and_end_in_order(session: Session) -> None:
    before = time.time_ns()
    first = session.submit("import time; time.sleep(0.3)")
    second = session.submit("1 + 1")  # waits in the queue behind the first
    await second.result()
    assert first.run is not None and second.run is not None
    for handle in (first, second):
        run = handle.run
        assert run is not None
        assert before <= handle.submitted_ns <= (handle.dequeued_ns or 0)
        assert (handle.dequeued_ns or 0) <= (run.sent_ns or 0) <= (run.idle_ns or 0)
        assert (run.idle_ns or 0) <= (handle.done_ns or 0)
        assert handle.actions == []  # nothing to resume, restore or restart
    # The second waited for the first's sleep in the queue, not in the kernel.
    assert (second.dequeued_ns or 0) - second.submitted_ns >= 250_000_000
    run = second.run
    assert (run.idle_ns or 0) - (run.sent_ns or 0) < 250_000_000


async def test_execution_on_a_paused_session_records_the_resume_it_caused(
        session: Session) -> None:
    await run_ok(session, "x = 41")
    await session.pause()
    handle = session.submit("print(x + 1)")
    execution = await handle.result()
    assert execution.stdout == "42\n"
    kinds = [action.kind for action in handle.actions]
    assert kinds == ["resume"]
    resume = handle.actions[0]
    assert not resume.failed
    assert handle.run is not None
    assert (handle.dequeued_ns or 0) <= resume.start_ns < resume.end_ns <= (handle.run.sent_ns
                                                                           or 0)
    # A resume asked for by itself is no execution's.
    await session.pause()
    await session.resume()
    assert [action.kind for action in handle.actions] == ["resume"]


async def test_execution_whose_kernel_dies_records_the_restart(session: Session) -> None:
    handle = session.submit("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    execution = await handle.result()
    assert execution.status == "died"
    assert [action.kind for action in handle.actions] == ["restart"]


async def test_usage_reads_memory_and_disk_against_the_limits(session: Session) -> None:
    await run_ok(session, "blob = bytearray(100 * 2**20)\nopen('f.bin', 'wb').write(b'x' * 2**22)")
    usage = await session.usage()
    assert not usage.paused
    assert usage.memory_bytes >= 100 * 2**20
    assert usage.memory_limit_bytes == parse_size(session.profile.memory)
    assert usage.disk_used_bytes >= 2**22
    assert usage.disk_limit_bytes >= usage.disk_used_bytes
    assert usage.cpu_ns is not None and usage.cpu_ns > 0
    assert usage.cpus == session.profile.cpus
    await session.pause()
    paused = await session.usage()
    assert (paused.paused, paused.memory_bytes, paused.cpu_ns) == (True, 0, None)
    assert paused.disk_used_bytes >= 2**22
