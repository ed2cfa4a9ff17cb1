"""A session's own file system beyond its workspace, through the port: reached in its container
as its user, the same wherever it runs."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kernel_pool import (
    FileTooLarge,
    InvalidRequest,
    SandboxFileDenied,
    SandboxFileError,
    SandboxFileExists,
    SandboxFileMissing,
    SandboxFsRequest,
    SessionPort,
)


async def _pieces(*pieces: bytes) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece


async def _read(session: SessionPort, path: str, limit: int = 1 << 20) -> bytes:
    return b"".join([chunk async for chunk in session.sandbox_read(path, limit)])


async def test_a_file_outside_the_workspace_round_trips_as_the_sandboxs_user(
        session: SessionPort) -> None:
    entry = await session.sandbox_write("/tmp/t/../git/a.bin",
                                        _pieces(b"\x00\x01", b"pay", b"load" * 100_000))
    assert (entry.path, entry.kind, entry.size, entry.owner) == (
        "/tmp/git/a.bin", "file", 400_005, 1000)
    assert await _read(session, "/tmp/git/a.bin") == b"\x00\x01pay" + b"load" * 100_000
    code = "import os; print(os.path.getsize('/tmp/git/a.bin'), os.stat('/tmp/git').st_uid)"
    assert (await session.submit(code).result()).stdout == "400005 1000\n"
    empty = await session.sandbox_write("/tmp/git/empty", _pieces())
    assert empty.size == 0 and await _read(session, "/tmp/git/empty") == b""


async def test_folders_of_the_sandbox_are_made_listed_moved_and_removed(
        session: SessionPort) -> None:
    made = await session.sandbox_fs(SandboxFsRequest(op="mkdir", path="/tmp/r/b"))
    assert made.created is True and made.entry is not None and made.entry.kind == "dir"
    again = await session.sandbox_fs(SandboxFsRequest(op="mkdir", path="/tmp/r/b"))
    assert again.created is False
    await session.sandbox_write("/tmp/r/a/x.txt", _pieces(b"x"))
    listed = await session.sandbox_fs(SandboxFsRequest(op="list", path="/tmp/r", depth=2))
    assert [e.path for e in listed.entries or []] == [
        "/tmp/r/a", "/tmp/r/a/x.txt", "/tmp/r/b"]  # depth-first, as E2B lists
    moved = await session.sandbox_fs(SandboxFsRequest(op="move", path="/tmp/r/a/x.txt",
                                                      destination="/tmp/s/y.txt"))
    assert moved.entry is not None and (moved.entry.path, moved.entry.size) == (
        "/tmp/s/y.txt", 1)
    await session.sandbox_fs(SandboxFsRequest(op="remove", path="/tmp/r"))
    with pytest.raises(SandboxFileMissing, match="/tmp/r"):
        await session.sandbox_fs(SandboxFsRequest(op="stat", path="/tmp/r"))


async def test_the_sandbox_refuses_what_its_user_may_not_do(session: SessionPort) -> None:
    with pytest.raises(SandboxFileDenied):
        await session.sandbox_write("/etc/replgate-test", _pieces(b"no"))
    with pytest.raises(SandboxFileDenied):
        await _read(session, "/etc/shadow")
    with pytest.raises(SandboxFileDenied):
        await session.sandbox_fs(SandboxFsRequest(op="remove", path="/etc/hostname"))
    with pytest.raises(SandboxFileMissing):
        await _read(session, "/tmp/nothing-here")
    with pytest.raises(SandboxFileError, match="is a folder"):
        await _read(session, "/etc")
    with pytest.raises(SandboxFileExists):
        await session.sandbox_fs(SandboxFsRequest(op="mkdir", path="/etc/hostname"))
    await session.sandbox_write("/tmp/big.bin", _pieces(b"x" * 100))
    with pytest.raises(FileTooLarge, match="100 bytes, over the download limit of 10"):
        await _read(session, "/tmp/big.bin", 10)
    with pytest.raises(InvalidRequest, match="not absolute"):
        await _read(session, "tmp/big.bin")


async def test_generated_files_are_read_whole(session: SessionPort) -> None:
    # under a limit of the gateway's size: a sysctl file refuses one read that large (ENOMEM)
    boot_id = await _read(session, "/proc/sys/kernel/random/boot_id", 100 * 1024 * 1024)
    assert len(boot_id.strip()) == 36
    with pytest.raises(FileTooLarge):
        await _read(session, "/proc/self/status", 10)


async def test_a_write_broken_off_leaves_no_file(session: SessionPort) -> None:
    async def breaking() -> AsyncIterator[bytes]:
        yield b"partial"
        raise ConnectionError("the upload broke off")

    with pytest.raises(ConnectionError):
        await session.sandbox_write("/tmp/broken.bin", breaking())
    with pytest.raises(SandboxFileMissing):
        await session.sandbox_fs(SandboxFsRequest(op="stat", path="/tmp/broken.bin"))


async def test_a_paused_session_is_resumed_to_reach_its_files(session: SessionPort) -> None:
    await session.sandbox_write("/tmp/kept.txt", _pieces(b"kept"))
    await session.pause()
    assert session.state().status.value == "paused"
    listed = await session.sandbox_fs(SandboxFsRequest(op="stat", path="/tmp"))
    assert listed.entry is not None and listed.entry.kind == "dir"
    await session.refresh()
    assert session.state().status.value != "paused"
    assert await _read(session, "/tmp/kept.txt") == b"kept"  # /tmp is kept by a pause
