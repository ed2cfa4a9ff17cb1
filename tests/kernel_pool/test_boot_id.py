"""Each sandbox's own boot id (``/proc/sys/kernel/random/boot_id``): new at each boot, kept
across a pause, the same to its kernel, its commands and the files API (real engine, real
CRIU, real kernels, under runc; fails, never skips, without them)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest
from kp_support import own_session, pausing_pool, run_ok

from kernel_pool import KernelPool, Session
from kernel_pool.backends.docker import DockerSandbox

BOOT_ID = "/proc/sys/kernel/random/boot_id"
HOST_BOOT_ID = Path(BOOT_ID).read_text().strip()
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
THREAD = ("import threading, time\n"
          "threading.Thread(target=lambda: time.sleep(3600), daemon=True).start()")
"""A running thread: the variables would lose it, so ``auto`` pauses with the memory."""


@pytest.fixture(scope="module")
async def boot_pool(state_root: Path, docker_client: docker.DockerClient,
                    ) -> AsyncIterator[KernelPool]:
    async with pausing_pool(state_root, docker_client, "boot", pause_with="auto") as pool:
        assert pool.backend.tree_checkpoints  # type: ignore[attr-defined]
        yield pool


@pytest.fixture
async def session(boot_pool: KernelPool) -> AsyncIterator[Session]:
    async with own_session(boot_pool) as own:
        yield own


async def boot_id(session: Session) -> str:
    """The sandbox's boot id, read by its kernel, by a shell command and through the files
    API, which must agree."""
    by_kernel = (await run_ok(session, f"print(open({BOOT_ID!r}).read(), end='')")).strip()
    command = await session.run_command(f"cat {BOOT_ID}")
    files = b"".join([chunk async for chunk in session.sandbox_read(BOOT_ID, 100)])
    assert command.exit_code == 0, command
    assert command.stdout.strip() == files.decode().strip() == by_kernel
    assert UUID.fullmatch(by_kernel), by_kernel
    return by_kernel


def sandbox_of(session: Session) -> DockerSandbox:
    sandbox = session.kernel.sandbox
    assert isinstance(sandbox, DockerSandbox)
    return sandbox


async def test_each_sandbox_has_its_own_boot_id_that_it_cannot_change(
        boot_pool: KernelPool, session: Session) -> None:
    other = await boot_pool.create_session()
    try:
        first, second = await boot_id(session), await boot_id(other)
    finally:
        await boot_pool.delete_session(other.id)

    assert len({first, second, HOST_BOOT_ID}) == 3
    tried = await session.run_command(
        f"umount {BOOT_ID}; umount /run/replgate/boot_id; echo 0 > {BOOT_ID}; "
        f"echo 0 > /run/replgate/boot_id; cat {BOOT_ID}")
    assert tried.stdout.strip() == first
    assert "must be superuser" in tried.stderr and "Read-only file system" in tried.stderr


async def test_a_restart_boots_anew(session: Session) -> None:
    before = await boot_id(session)

    await session.restart()

    assert await boot_id(session) not in (before, HOST_BOOT_ID)


async def test_a_pause_with_variables_keeps_the_boot_id_in_a_new_container(
        boot_pool: KernelPool, session: Session) -> None:
    before = await boot_id(session)
    container = session.sandbox_info().container_id

    info = await session.pause()

    assert info.paused_with == "variables" and info.boot_id == before
    # Kept with the snapshot's records, for a gateway that takes the paused session back.
    stored = boot_pool.snapshots.info(session.id)
    assert stored is not None and stored.boot_id == before
    await session.resume()
    assert session.sandbox_info().container_id != container
    assert await boot_id(session) == before
    await session.restart()  # the resumed machine boots anew like any
    assert await boot_id(session) != before


@pytest.mark.parametrize("outside", [False, True], ids=["kernel tree", "engine"])
async def test_a_memory_pause_keeps_the_boot_id(session: Session, outside: bool) -> None:
    before = await boot_id(session)
    await run_ok(session, THREAD)
    if outside:
        # A process outside the kernel's tree (re-parented to PID 1, after the execution,
        # whose end kills what it leaves there) makes the engine dump the whole container,
        # whose image holds the bind over /proc.
        await run_ok(session, "import subprocess, threading\n"
                              "threading.Timer(0.3, subprocess.run, [['sh', '-c', "
                              "'sleep 600 >/dev/null 2>&1 &']]).start()")
        await asyncio.sleep(1.5)

    info = await session.pause()

    assert info.paused_with == "memory", session.reason
    assert sandbox_of(session).memory_path == ("engine" if outside else "kernel tree")
    await session.resume()
    assert session.reason is None
    assert sandbox_of(session).memory_path == ("engine" if outside else "kernel tree")
    assert await boot_id(session) == before


async def test_a_paused_sessions_fork_boots_with_its_own(boot_pool: KernelPool,
                                                         session: Session) -> None:
    parent = await boot_id(session)
    await session.pause()

    [copy] = await boot_pool.fork_session(session.id)
    try:
        assert copy.paused
        await copy.resume()
        assert await boot_id(copy) not in (parent, HOST_BOOT_ID)
    finally:
        await boot_pool.delete_session(copy.id)
    await session.resume()
    assert await boot_id(session) == parent


async def test_a_resume_onto_a_warm_kernel_keeps_the_boot_id(pool: KernelPool) -> None:
    async with own_session(pool) as session:
        before = await boot_id(session)
        kernel = session.kernel
        await session.pause()
        await pool.wait_ready()

        await session.resume()

        assert session.kernel is not kernel  # the warm one, in its own container
        assert await boot_id(session) == before
