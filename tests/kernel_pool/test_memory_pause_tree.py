"""Memory pauses by a kernel-tree dump: CRIU inside the sandbox's container dumps the kernel's
tree, and restores it into the same container started again (real engine, real CRIU, real
kernels; fails, never skips, without them)."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest
from kp_support import pausing_pool, run_ok

from kernel_pool import KernelPool
from kernel_pool.backends.docker import DockerSandbox
from kernel_pool.backends.docker._packing import (
    ABOUT_NAME,
    COMPRESSOR,
    IMAGE_SUFFIX,
    Packing,
    first_records,
)

SETUP = """
import os, subprocess, threading, time
import numpy as np
ones = np.ones(200 * 2**20 // 8)
counter = [0]
def _count():
    while True:
        counter[0] += 1
        time.sleep(0.01)
threading.Thread(target=_count, daemon=True).start()
scratch = open("/tmp/scratch.txt", "w+")
scratch.write("0123456789")
scratch.flush()
scratch.seek(3)
open("/dev/shm/shared", "w").write("in shm")
child = subprocess.Popen(["sleep", "600"])
"""

HARDENING = """
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines()
              if ":\\t" in line)
print(status["Uid"].split()[0], status["CapEff"].strip(), status["NoNewPrivs"].strip(),
      status["Seccomp"].strip())
"""


@pytest.fixture(scope="module")
async def memory_pool(state_root: Path, docker_client: docker.DockerClient,
                      ) -> AsyncIterator[KernelPool]:
    async with pausing_pool(state_root, docker_client, "tree", pause_with="memory") as pool:
        assert pool.backend.tree_checkpoints  # type: ignore[attr-defined]
        yield pool


def sandbox_of(session: object) -> DockerSandbox:
    sandbox = session.kernel.sandbox  # type: ignore[attr-defined]
    assert isinstance(sandbox, DockerSandbox)
    return sandbox


async def test_memory_pause_of_200_mib_restores_the_kernel_tree_with_its_state(
        memory_pool: KernelPool, caplog: pytest.LogCaptureFixture) -> None:
    session = await memory_pool.create_session()
    try:
        await run_ok(session, SETUP)
        hardening = await run_ok(session, HARDENING)
        caplog.set_level(logging.INFO, "kernel_pool.backends.docker._sandbox_checkpoint")

        info = await session.pause()

        assert info.paused_with == "memory", session.reason
        assert sandbox_of(session).memory_path == "kernel tree"
        assert "memory pause by a kernel-tree dump" in caplog.text
        await session.packed()
        await session.resume()

        assert session.reason is None
        assert sandbox_of(session).memory_path == "kernel tree"
        assert "kernel tree restored inside its container" in caplog.text
        counted = int(await run_ok(session, "print(counter[0])"))
        await asyncio.sleep(0.2)
        assert int(await run_ok(session, "print(counter[0])")) > counted  # the thread runs on
        assert await run_ok(session, "print(scratch.tell(), scratch.read())") == "3 3456789\n"
        assert await run_ok(session, "print(open('/dev/shm/shared').read())") == "in shm\n"
        assert await run_ok(session, "print(child.poll(), int(ones.sum()))") == (
            f"None {200 * 2**20 // 8}\n")
        # The restored kernel keeps the sandbox's hardening: uid 1000, no capabilities,
        # no-new-privileges, the seccomp filter; and is charged to the container's cgroups.
        assert await run_ok(session, HARDENING) == hardening
        assert hardening.split() == ["1000", "0000000000000000", "1", "2"]
        sandbox = sandbox_of(session)
        procs = sandbox._cgroup.procs_file if sandbox._cgroup is not None else None
        assert procs is not None and sandbox.info.kernel_ref is not None
        assert sandbox.info.kernel_ref in procs.read_text().split()
        # A second pause of the restored kernel takes the same path.
        assert (await session.pause()).paused_with == "memory"
        await session.resume()
        assert sandbox_of(session).memory_path == "kernel tree" and session.reason is None
        # Read to its end above: the position is where that read left it.
        assert await run_ok(session, "print(scratch.tell(), child.poll())") == "10 None\n"
    finally:
        await memory_pool.delete_session(session.id)


async def test_a_process_outside_the_kernel_tree_makes_a_whole_container_dump(
        memory_pool: KernelPool) -> None:
    session = await memory_pool.create_session()
    try:
        # Started after the execution (whose end kills what it left outside the kernel's
        # tree), by a timer: the shell exits at once, its sleep re-parented to PID 1.
        await run_ok(session, "import subprocess, threading\n"
                              "threading.Timer(0.3, subprocess.run, [['sh', '-c', "
                              "'sleep 600 >/dev/null 2>&1 &']]).start()")
        await asyncio.sleep(1.5)

        assert (await session.pause()).paused_with == "memory", session.reason

        assert sandbox_of(session).memory_path == "engine"
        await session.resume()
        assert sandbox_of(session).memory_path == "engine" and session.reason is None
        orphans = await run_ok(session, "import os\nprint(sum(open(f'/proc/{p}/cmdline').read()"
                                        ".startswith('sleep') for p in os.listdir('/proc') "
                                        "if p.isdigit()))")
        assert orphans == "1\n"
    finally:
        await memory_pool.delete_session(session.id)


SYSV_QUEUE = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
queue = libc.msgget(0, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600: in no process's memory
assert queue >= 0, ctypes.get_errno()
message = ctypes.create_string_buffer(b"\\x01\\0\\0\\0\\0\\0\\0\\0kept in System V", 32)
assert libc.msgsnd(queue, message, 16, 0) == 0, ctypes.get_errno()
"""
RECEIVE = """
received = ctypes.create_string_buffer(32)
size = libc.msgrcv(queue, received, 16, 0, 0o4000)  # IPC_NOWAIT
print(received.raw[8:8 + size].decode() if size > 0 else f"no message: {ctypes.get_errno()}")
"""


async def test_a_system_v_message_queue_makes_a_whole_container_dump_that_keeps_it(
        memory_pool: KernelPool) -> None:
    session = await memory_pool.create_session()
    try:
        await run_ok(session, SYSV_QUEUE)

        assert (await session.pause()).paused_with == "memory", session.reason

        # A tree dump would lose the queue (it is the IPC namespace's, in no process of the
        # tree): the engine's dump of the whole container holds it.
        assert sandbox_of(session).memory_path == "engine"
        await session.resume()
        assert await run_ok(session, RECEIVE) == "kept in System V\n"
    finally:
        await memory_pool.delete_session(session.id)


async def test_a_failed_tree_dump_falls_back_to_the_engine_and_says_so(
        memory_pool: KernelPool, caplog: pytest.LogCaptureFixture) -> None:
    session = await memory_pool.create_session()
    try:
        # A file its own user cannot read: tar, saving /tmp as that user, fails; runc's dump
        # (root's) keeps it.
        await run_ok(session, SETUP + "os.chmod('/tmp/scratch.txt', 0)")
        caplog.set_level(logging.INFO, "kernel_pool.backends.docker._sandbox_checkpoint")

        assert (await session.pause()).paused_with == "memory", session.reason

        assert sandbox_of(session).memory_path == "engine"
        assert "the kernel-tree dump failed" in caplog.text
        assert "dumps the whole container instead" in caplog.text
        await session.resume()
        assert session.reason is None
        counted = int(await run_ok(session, "print(counter[0])"))
        await asyncio.sleep(0.2)
        # The tree, stopped after its dump, was continued before the engine's dump.
        assert int(await run_ok(session, "print(counter[0])")) > counted
        assert await run_ok(session, "print(scratch.tell(), child.poll())") == "3 None\n"
    finally:
        await memory_pool.delete_session(session.id)


def test_a_packed_dump_gives_its_records_before_it_is_unpacked(tmp_path: Path) -> None:
    # A resume starts the container while the rest is unpacked: the records come first.
    dump = tmp_path / "dump"
    dump.mkdir()
    (dump / "a.img").write_bytes(bytes(range(256)) * 4096)
    (dump / ABOUT_NAME).write_text(json.dumps({"kernel_tree": True, "kernel_name": "k1"}))
    (dump / "z.img").write_text("z")
    image = Packing(dump, tmp_path / "packed").run()
    assert first_records(image) == {"kernel_tree": True, "kernel_name": "k1"}
    # An archive of an earlier gateway (records anywhere) is unpacked before it is read.
    earlier = tmp_path / f"earlier{IMAGE_SUFFIX}"
    with open(earlier, "wb") as out:
        tar = subprocess.run(["tar", "-C", str(dump), "-cf", "-", "a.img", ABOUT_NAME],
                             capture_output=True, check=True)
        subprocess.run(COMPRESSOR, input=tar.stdout, stdout=out, check=True)
    assert first_records(earlier) is None
