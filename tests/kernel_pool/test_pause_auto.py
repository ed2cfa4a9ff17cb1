"""The default pause (``pause_with="auto"``): the variables when they are all a session holds,
the whole memory when a variables snapshot would lose something (real engine, CRIU, kernels)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest
from kp_support import own_session, pausing_pool, run_ok

from kernel_pool import KernelPool, Session

PROCESS_STATE = """
import threading, time
counter = [0]
def _count():
    while True:
        counter[0] += 1
        time.sleep(0.01)
threading.Thread(target=_count, name="ticker", daemon=True).start()
open("/tmp/scratch.txt", "w").write("only in /tmp")
x = 41
"""


@pytest.fixture(scope="module")
async def auto_pool(state_root: Path, docker_client: docker.DockerClient,
                    ) -> AsyncIterator[KernelPool]:
    async with pausing_pool(state_root, docker_client, "auto") as pool:
        assert pool.settings.pause_with == "auto"  # the default, tested as shipped
        yield pool


@pytest.fixture
async def session(auto_pool: KernelPool) -> AsyncIterator[Session]:
    async with own_session(auto_pool) as own:
        yield own


async def test_auto_pause_keeps_variables_when_they_are_all_a_session_holds(
        session: Session) -> None:
    await run_ok(session, "import numpy as np\nx = 41\narr = np.arange(5)")
    info = await session.pause()
    assert (info.paused_with, info.not_kept, session.reason) == ("variables", {}, None)
    assert await run_ok(session, "print(x + 1, arr.sum())") == "42 10\n"


async def test_auto_pause_keeps_memory_when_variables_would_lose_a_thread_and_tmp(
        session: Session) -> None:
    await run_ok(session, PROCESS_STATE)
    before = int(await run_ok(session, "print(counter[0])"))
    info = await session.pause()
    assert info.paused_with == "memory", session.reason
    assert info.not_kept == {}
    # Had the memory image been lost, the variables snapshot would have lost these.
    assert {"thread 'ticker'", "/tmp/scratch.txt"} <= set(info.variables_not_kept)
    assert await run_ok(session, "print(open('/tmp/scratch.txt').read(), x)") == (
        "only in /tmp 41\n")
    after = int(await run_ok(session, "print(counter[0])"))
    assert after > before  # the same thread, counting on where it stopped
    assert session.reason is None


async def test_auto_pause_without_checkpoints_lists_the_thread_and_tmp_it_lost(
        auto_pool: KernelPool) -> None:
    # gVisor cannot be checkpointed here: the pause keeps the variables and names the rest.
    session = await auto_pool.create_session("hostile")
    try:
        await run_ok(session, PROCESS_STATE)
        info = await session.pause()
        assert info.paused_with == "variables"
        assert info.not_kept["thread 'ticker'"].startswith("a running thread")
        assert info.not_kept["/tmp/scratch.txt"].startswith("a file in /tmp")
        assert "x" in info.kept
        assert session.reason is not None and "memory pauses are not available" in session.reason
        assert await run_ok(session, "print(x)") == "41\n"
    finally:
        await auto_pool.delete_session(session.id)


async def test_memory_pause_stops_a_running_command_before_its_dump(
        session: Session) -> None:
    await run_ok(session, PROCESS_STATE)
    command = session.prepare_command("sleep 100")
    running = asyncio.ensure_future(session.run_prepared(command))
    await asyncio.sleep(1)
    info = await session.pause()
    assert info.paused_with == "memory", session.reason
    # The memory keeps the thread and /tmp, not the command (not the kernel's process).
    assert info.not_kept == {"command 'sleep 100'":
                             "a running shell command: the pause stopped it"}
    assert "thread 'ticker'" in info.kept
    assert (await asyncio.wait_for(running, 10)).status == "killed"
    assert await run_ok(session, "print(x)") == "41\n"
