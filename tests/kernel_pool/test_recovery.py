"""Recovery: a kernel that dies (exit, out of memory, container gone) is reported and replaced."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import docker
import docker.errors
import pytest
from kp_support import eventually, run_ok

from kernel_pool import KernelPool, Session
from kernel_pool._channels import KernelState


async def test_os_exit_reported_died_and_recovered(session: Session) -> None:
    await run_ok(session, "lost = 1\nopen('kept.txt', 'w').write('kept')")
    started = time.monotonic()
    result = await session.execute("import os\nos._exit(3)", timeout_s=60)
    assert time.monotonic() - started < 15
    assert result.status == "died"
    assert result.restarted is True
    assert result.reason is not None and "exited (code 3)" in result.reason
    assert "memory" not in result.reason
    after = await session.execute("lost")
    assert after.error is not None and after.error.ename == "NameError"
    assert await run_ok(session, "print(open('kept.txt').read())") == "kept\n"


async def test_memory_bomb_reported_died_with_oom_reason(small_session: Session) -> None:
    result = await small_session.execute(
        "hoard = []\nwhile True:\n    hoard.append(bytearray(8 * 2**20))", timeout_s=60)
    assert result.restarted is True
    # Under gVisor too: the OOM kill of gVisor's helper leaves the kernel stuck at the limit,
    # and the backend ends it (docker._gvisor.OutOfMemoryWatch), well before the timeout.
    assert result.status == "died", result
    assert result.reason is not None and "ran out of memory" in result.reason
    assert await run_ok(small_session, "print(len('recovered'))") == "9\n"


async def test_container_killed_from_outside_reported_died(
        session: Session, docker_client: docker.DockerClient) -> None:
    await run_ok(session, "open('kept.txt', 'w').write('kept')")
    old_container = session.kernel.sandbox.info.container_id
    handle = session.submit("import time\nprint('running', flush=True)\ntime.sleep(60)",
                            timeout_s=90)
    async for event in handle.stream():
        if event.type == "stdout":
            break
    killed_at = time.monotonic()
    await asyncio.to_thread(docker_client.api.kill, old_container)
    await eventually(lambda: session.kernel.state != KernelState.READY, 3)  # detected
    detected_after = time.monotonic() - killed_at
    result = await asyncio.wait_for(handle.result(), 30)
    assert result.status == "died", detected_after
    assert result.restarted is True
    assert session.kernel.sandbox.info.container_id != old_container
    assert await run_ok(session, "print(open('kept.txt').read())") == "kept\n"


async def test_death_between_executions_recovered_before_next(session: Session) -> None:
    await run_ok(session, "import os, threading\nthreading.Timer(0.3, os._exit, (1,)).start()")
    # Noticed at once, and a fresh kernel is started without waiting for the next execution.
    await eventually(lambda: session.kernel.state != KernelState.READY, 5)
    started = time.monotonic()
    result = await session.execute("print('fresh')", timeout_s=30)
    assert result.status == "ok", result.reason
    assert result.stdout == "fresh\n"
    assert result.execution_count == 1
    assert time.monotonic() - started < 15


async def test_delete_ends_a_sandbox_whose_processes_are_stopped(
        pool: KernelPool, docker_client: docker.DockerClient) -> None:
    """A delete ends its container in bounded time whatever the sandbox does: here its
    container's process is stopped from the host (under gVisor that is gVisor's kernel, which
    then answers neither its control socket nor the engine, whose removal alone outlasted
    100 s)."""
    session = await pool.create_session()
    container_id = session.kernel.sandbox.info.container_id
    pid = int(docker_client.api.inspect_container(container_id)["State"]["Pid"])
    os.kill(pid, signal.SIGSTOP)
    try:
        async with asyncio.timeout(30):
            await pool.delete_session(session.id)
        with pytest.raises(docker.errors.NotFound):
            docker_client.api.inspect_container(container_id)
    finally:
        with contextlib.suppress(ProcessLookupError):  # a removal left stuck by a failure
            os.kill(pid, signal.SIGKILL)


async def test_delete_during_a_fork_bomb_ends_its_container(
        pool: KernelPool, docker_client: docker.DockerClient) -> None:
    """Under gVisor the engine's removal of a sandbox swamped by a fork bomb took 85-190 s in 2
    runs of 4 (its runtime shim deadlocked on the sandbox's exit during its kill): the delete
    ends gVisor's kernel and waits for the engine to see it exit before removing."""
    session = await pool.create_session()
    container_id = session.kernel.sandbox.info.container_id
    bomb = session.submit("import subprocess, time\nsubprocess.Popen(['sh', '-c', "
                          "'b(){ b|b& }; b'], stderr=subprocess.DEVNULL)\ntime.sleep(60)",
                          timeout_s=90)
    await asyncio.sleep(3)  # at the process limit by now
    async with asyncio.timeout(30):
        await pool.delete_session(session.id)
    with pytest.raises(docker.errors.NotFound):
        docker_client.api.inspect_container(container_id)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(bomb.result(), 10)
