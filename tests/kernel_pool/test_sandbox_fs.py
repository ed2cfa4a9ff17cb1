"""The sandbox's own files beyond its workspace (``kernel_pool._sandbox_fs``), under runc and
gVisor: reached in the container as the sandbox's user, its refusals as the pool's errors."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest
from kp_support import pausing_pool

from kernel_pool import (
    KernelPool,
    SandboxDiskFull,
    SandboxFileDenied,
    SandboxFsRequest,
    Session,
)


@pytest.fixture(scope="module")
async def fs_pool(state_root: Path, docker_client: docker.DockerClient,
                  ) -> AsyncIterator[KernelPool]:
    async with pausing_pool(state_root, docker_client, "sandboxfs") as pool:
        yield pool


@pytest.fixture(params=["default", "hostile"], ids=["runc", "gvisor"])
async def any_session(request: pytest.FixtureRequest,
                      fs_pool: KernelPool) -> AsyncIterator[Session]:
    session = await fs_pool.create_session(request.param)
    yield session
    if not session.closed:
        await fs_pool.delete_session(session.id)


async def _pieces(*pieces: bytes) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece


async def _read(session: Session, path: str, limit: int = 1 << 20) -> bytes:
    return b"".join([chunk async for chunk in session.sandbox_read(path, limit)])


async def test_files_of_the_sandbox_are_its_users(any_session: Session) -> None:
    entry = await any_session.sandbox_write("/tmp/a/b.txt", _pieces(b"one ", b"two"))
    assert (entry.path, entry.size, entry.owner, entry.group) == ("/tmp/a/b.txt", 7, 1000, 1000)
    assert await _read(any_session, "/tmp/a/b.txt") == b"one two"
    result = await any_session.submit("print(open('/tmp/a/b.txt').read())").result()
    assert result.stdout == "one two\n"
    assert len((await _read(any_session, "/proc/sys/kernel/random/boot_id")).strip()) == 36
    listed = await any_session.sandbox_fs(SandboxFsRequest(op="list", path="/proc/self"))
    assert "status" in {e.path.rsplit("/", 1)[-1] for e in listed.entries or []}


async def test_the_workspace_reached_through_the_container_is_the_same(
        any_session: Session) -> None:
    await any_session.sandbox_write("/tmp/moved.txt", _pieces(b"moved"))
    await any_session.sandbox_fs(SandboxFsRequest(op="move", path="/tmp/moved.txt",
                                                  destination="/home/user/in/moved.txt"))
    assert await any_session.read_file("in/moved.txt", 100) == b"moved"


async def test_read_only_system_folders_and_a_full_tmp_are_refused(
        any_session: Session) -> None:
    with pytest.raises(SandboxFileDenied):
        await any_session.sandbox_write("/usr/lib/x", _pieces(b"no"))
    with pytest.raises(SandboxFileDenied):
        await any_session.sandbox_fs(SandboxFsRequest(op="mkdir", path="/opt/replgate/x"))
    block = b"\x00" * (1 << 20)
    with pytest.raises(SandboxDiskFull):  # the profiles' /tmp holds 32 MiB
        await any_session.sandbox_write("/tmp/fill.bin", _pieces(*[block] * 40))
