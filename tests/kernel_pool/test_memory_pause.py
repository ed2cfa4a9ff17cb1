"""A memory pause: the whole sandbox checkpointed by CRIU through the engine, restored on
resume (real engine, real CRIU, real kernels; fails, never skips, without them)."""

from __future__ import annotations

import asyncio
import contextlib
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import docker.errors
import pytest
from kp_support import (
    OWNER,
    eventually,
    make_settings,
    mounts_under,
    owned_containers,
    run_ok,
)

from kernel_pool import KernelPool, Profile, Session
from kernel_pool._kernel import KernelState

SETUP = """
import threading, time
counter = [0]
def _count():
    while True:
        counter[0] += 1
        time.sleep(0.01)
threading.Thread(target=_count, daemon=True).start()
def _letters():
    yield from "abcdef"
letters = _letters()
next(letters)
handle = open("notes.txt", "w+")
handle.write("0123456789")
handle.seek(4)
open("/tmp/scratch.txt", "w").write("kept in tmp")
x = 41
"""


@pytest.fixture(scope="module")
async def memory_pool(state_root: Path, docker_client: docker.DockerClient,
                      ) -> AsyncIterator[KernelPool]:
    owner = f"{OWNER}-memory"
    pool = KernelPool(make_settings(
        state_root / "memory", owner=owner, pause_with="memory",
        profiles={"default": Profile(name="default", workspace_size="64m", tmp_size="32m",
                                     min_idle=0)}))
    await pool.start()
    yield pool
    await pool.close()
    assert owned_containers(docker_client, owner) == []
    assert mounts_under(pool.settings.state_dir) == []


@pytest.fixture
async def paused(memory_pool: KernelPool) -> AsyncIterator[Session]:
    """A session whose kernel holds a thread, a generator, an open file, /tmp and a variable,
    paused with memory."""
    session = await memory_pool.create_session()
    await run_ok(session, SETUP)
    before = int(await run_ok(session, "print(counter[0])"))
    assert before > 0
    info = await session.pause()
    assert info.paused_with == "memory", session.reason
    yield session
    if not session.closed:
        await memory_pool.delete_session(session.id)


def container_running(docker_client: docker.DockerClient, session: Session) -> bool:
    try:
        state = docker_client.api.inspect_container(session.sandbox_info().container_id)["State"]
    except docker.errors.NotFound:
        return False
    return bool(state["Running"])


async def test_memory_pause_keeps_thread_generator_open_file_tmp_and_variables(
        paused: Session, memory_pool: KernelPool, docker_client: docker.DockerClient) -> None:
    assert not container_running(docker_client, paused)  # no process of it runs
    image = memory_pool.snapshots.memory_image(paused.id)
    assert image is not None and image.stat().st_size > 0
    assert stat.S_IMODE(image.stat().st_mode) == 0o600
    assert paused.pause_info is not None and paused.pause_info.image_bytes > image.stat().st_size
    at_pause = paused.pause_info

    await paused.resume()

    assert paused.reason is None
    counted = int(await run_ok(paused, "print(counter[0])"))
    await asyncio.sleep(0.2)
    assert int(await run_ok(paused, "print(counter[0])")) > counted  # the thread runs on
    assert await run_ok(paused, "print(next(letters))") == "b\n"
    assert await run_ok(paused, "print(handle.tell(), handle.read())") == "4 456789\n"
    assert await run_ok(paused, "print(open('/tmp/scratch.txt').read(), x)") == "kept in tmp 41\n"
    assert memory_pool.snapshots.memory_image(paused.id) is None  # deleted once resumed
    # Everything is kept; dill alone would have lost the generator and the open file.
    assert {"x", "letters", "handle"} <= set(at_pause.kept) and not at_pause.not_kept
    assert "letters" in at_pause.variables_not_kept


async def test_memory_image_deleted_with_its_session(paused: Session,
                                                     memory_pool: KernelPool) -> None:
    image = memory_pool.snapshots.memory_image(paused.id)
    assert image is not None
    await memory_pool.delete_session(paused.id)
    await eventually(lambda: not image.exists(), timeout_s=10)
    assert memory_pool.snapshots.info(paused.id) is None


async def test_corrupt_memory_image_resumes_from_variables_and_says_so(
        paused: Session, memory_pool: KernelPool) -> None:
    image = memory_pool.snapshots.memory_image(paused.id)
    assert image is not None
    image.write_bytes(b"not an image" * 100)

    await paused.resume()

    assert paused.reason is not None and "resumed from its variables snapshot" in paused.reason
    assert "not kept: " in paused.reason and "letters" in paused.reason
    assert await run_ok(paused, "print(x)") == "41\n"
    missing = await paused.execute("next(letters)")  # a generator is not in a variables snapshot
    assert missing.status == "error"


async def test_refused_dump_pauses_with_variables_and_says_so(
        memory_pool: KernelPool, docker_client: docker.DockerClient) -> None:
    session = await memory_pool.create_session()
    try:
        # An open file deleted from the workspace is a "ghost" to CRIU, kept only up to 1 MiB:
        # past that the engine's checkpoint fails.
        await run_ok(session, "import os\nghost = open('big.bin', 'wb+')\n"
                              "ghost.write(os.urandom(3 << 20))\nos.unlink('big.bin')\nx = 41")
        info = await session.pause()
        assert info.paused_with == "variables"
        assert session.reason is not None and "memory checkpoint failed" in session.reason
        assert "ghost" in session.reason  # CRIU's own words, from its log
        assert memory_pool.snapshots.memory_image(session.id) is None
        await eventually(lambda: not container_running(docker_client, session), timeout_s=30)
        await session.resume()
        assert await run_ok(session, "print(x)") == "41\n"
    finally:
        await memory_pool.delete_session(session.id)


async def test_fork_of_a_memory_paused_session_copies_its_variables_snapshot(
        paused: Session, memory_pool: KernelPool) -> None:
    [child] = await memory_pool.fork_session(paused.id, 1, None)
    try:
        # No warm kernel (min_idle 0): the copy is answered paused, and is never restored
        # from the parent's memory image.
        assert child.paused and child.pause_info is not None
        assert child.pause_info.paused_with == "variables"
        assert "letters" in child.pause_info.not_kept
        assert await run_ok(child, "print(x)") == "41\n"
        assert paused.pause_info is not None and paused.pause_info.paused_with == "memory"
        await paused.resume()
        assert paused.reason is None
        assert await run_ok(paused, "print(next(letters))") == "b\n"
    finally:
        await memory_pool.delete_session(child.id)


async def test_cancelled_memory_resume_leaves_the_session_paused_and_resumable(
        paused: Session, memory_pool: KernelPool) -> None:
    resuming = asyncio.create_task(paused.resume())
    await eventually(lambda: paused.kernel.state is KernelState.STARTING, timeout_s=30)
    resuming.cancel()  # a client gone, a gateway shutting down: mid-restore
    with pytest.raises(asyncio.CancelledError):
        await resuming

    assert paused.paused
    assert " 0 in use" in repr(memory_pool)  # its slot is free again
    await paused.resume()
    assert await run_ok(paused, "print(x)") == "41\n"
    # The half-restored container was removed with the rest: the memory image cannot be
    # restored any more, and the resume says which snapshot it came from.
    assert paused.reason is not None and "resumed from its variables snapshot" in paused.reason


async def test_cancelled_memory_pause_ends_paused_with_variables(
        memory_pool: KernelPool) -> None:
    session = await memory_pool.create_session()
    try:
        await run_ok(session, "x = 41")
        pausing = asyncio.create_task(session.pause())
        # The variables snapshot is written: what follows is the memory checkpoint.
        await eventually(lambda: session.pause_info is not None, timeout_s=30)
        pausing.cancel()  # as a gateway shutting down cancels the pauses it started
        with contextlib.suppress(asyncio.CancelledError):
            await pausing

        assert session.paused, session.status
        assert session.pause_info is not None
        assert session.pause_info.paused_with == "variables"
        assert " 0 in use" in repr(memory_pool)
        await session.resume()
        assert await run_ok(session, "print(x)") == "41\n"
    finally:
        await memory_pool.delete_session(session.id)


async def test_session_resumed_from_its_variables_is_paused_by_itself_again(
        state_root: Path, docker_client: docker.DockerClient) -> None:
    # Its ``reason`` (the resume kept less than asked) is news, not a failed pause, which
    # alone keeps the pool from pausing a session by itself.
    owner = f"{OWNER}-memory-idle"
    pool = KernelPool(make_settings(
        state_root / "memory-idle", owner=owner, pause_with="memory", pause_after_s=1.0,
        cull_interval_s=0.2,
        profiles={"default": Profile(name="default", workspace_size="64m", tmp_size="32m",
                                     min_idle=0)}))
    await pool.start()
    try:
        session = await pool.create_session()
        await run_ok(session, "x = 41")
        await eventually(lambda: session.pause_info is not None
                         and session.pause_info.paused_with == "memory", timeout_s=30)
        image = pool.snapshots.memory_image(session.id)
        assert image is not None
        image.write_bytes(b"not an image")
        await session.resume()
        assert session.reason is not None and "variables snapshot" in session.reason

        await eventually(lambda: session.paused, timeout_s=30)
        assert await run_ok(session, "print(x)") == "41\n"
    finally:
        await pool.close()
    assert owned_containers(docker_client, owner) == []
