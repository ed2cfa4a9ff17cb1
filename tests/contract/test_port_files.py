"""A session's workspace and shell commands through the port, and what it says of its sandbox,
the same wherever it runs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kernel_pool import (
    CommandStatus,
    FileMissing,
    FileTooLarge,
    InvalidRequest,
    PathOutsideWorkspace,
    SessionPort,
    StreamEvent,
)


async def test_files_round_trip_through_the_workspace(session: SessionPort) -> None:
    assert await session.write_file("data/a.bin", b"\x00\x01payload") == 9
    assert await session.read_file("data/a.bin", 100) == b"\x00\x01payload"
    assert {f.path: f.size for f in await session.list_files()} == {"data/a.bin": 9}
    read = await session.submit("print(open('data/a.bin', 'rb').read()[2:])").result()
    assert read.stdout == "b'payload'\n"


async def test_an_empty_file_is_written_and_read(session: SessionPort) -> None:
    assert await session.write_file("empty.txt", b"") == 0
    assert await session.read_file("empty.txt", 100) == b""
    assert (await session.stat_path("empty.txt")).size == 0


async def test_file_refusals_are_raised_as_their_class(session: SessionPort) -> None:
    await session.write_file("big.bin", b"x" * 100)

    with pytest.raises(FileMissing, match=r"nope\.txt"):
        await session.read_file("nope.txt", 100)
    with pytest.raises(FileTooLarge,
                       match=r"'big\.bin' is 100 bytes, over the download limit of 10$"):
        await session.read_file("big.bin", 10)
    with pytest.raises(PathOutsideWorkspace):
        await session.write_file("../escape.bin", b"no")
    with pytest.raises(PathOutsideWorkspace):
        await session.list_dir("../etc")


async def test_folders_are_made_listed_moved_and_removed(session: SessionPort) -> None:
    assert await session.make_dir("r/2026") is True
    assert await session.make_dir("r/2026") is False
    await session.write_file("r/2026/a.txt", b"abc")
    stat = await session.stat_path("r/2026/a.txt")
    assert (stat.path, stat.kind, stat.size) == ("r/2026/a.txt", "file", 3)
    listed = {e.path: e.kind for e in await session.list_dir("", depth=3)}
    assert listed == {"r": "dir", "r/2026": "dir", "r/2026/a.txt": "file"}
    assert [e.path for e in await session.list_dir("r")] == ["r/2026"]

    moved = await session.move_path("r/2026/a.txt", "s/b.txt")
    assert (moved.path, moved.size) == ("s/b.txt", 3)
    await session.remove_path("r")

    assert {e.path for e in await session.list_dir("")} == {"s"}
    with pytest.raises(FileMissing):
        await session.stat_path("r")
    with pytest.raises(FileMissing):
        await session.remove_path("r")


async def test_a_command_streams_its_output_and_ends_with_its_exit_code(
        session: SessionPort) -> None:
    seen: list[StreamEvent] = []
    result = await session.run_command("echo out; echo err >&2; echo $GREETING; exit 3",
                                       emit=seen.append)

    assert (result.status, result.exit_code, result.truncated) == (CommandStatus.OK, 3, False)
    assert (result.stdout, result.stderr) == ("out\nhi\n", "err\n")
    # Each stream's output in its order (the two pipes are read apart: no order between them;
    # how a stream's text is cut into events is not promised).
    assert "".join(e.text for e in seen if e.type == "stdout") == "out\nhi\n"
    assert "".join(e.text for e in seen if e.type == "stderr") == "err\n"


async def test_a_command_hears_its_env_and_folder(session: SessionPort) -> None:
    made = await session.run_command("mkdir -p d && cd d && pwd")
    here = await session.run_command('pwd; echo "$ONE"', cwd="d", env={"ONE": "1"})

    assert here.stdout == f"{made.stdout}1\n" == "/home/user/d\n1\n"


async def test_a_command_is_killed_by_its_id(session: SessionPort) -> None:
    up = asyncio.Event()
    started = asyncio.Event()
    running = asyncio.ensure_future(session.run_command(
        "echo up; sleep 100", command_id="c-long", emit=lambda _e: up.set(),
        on_start=started.set))
    await asyncio.wait_for(up.wait(), 30)

    assert started.is_set()
    assert await session.kill_command("c-long") is True
    killed = await asyncio.wait_for(running, 30)
    assert (killed.status, killed.exit_code, killed.stdout) == (CommandStatus.KILLED, None,
                                                                 "up\n")
    assert await session.kill_command("c-long") is False, "none runs under that id now"


async def test_a_command_past_its_timeout_is_stopped(session: SessionPort) -> None:
    timed = await session.run_command("echo started; sleep 30", timeout_s=1)

    assert (timed.status, timed.exit_code) == (CommandStatus.TIMEOUT, None)
    assert timed.stdout == "started\n" and "timeout_s=1" in (timed.reason or "")


BAD_COMMANDS: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("", {}, InvalidRequest, "cmd is empty"), ("   ", {}, InvalidRequest, "cmd is empty"),
    ("ls", {"timeout_s": 0}, InvalidRequest, "timeout_s must be above 0"),
    ("ls", {"timeout_s": 10_000}, InvalidRequest, "timeout_s must be above 0"),
    ("ls", {"cwd": "../etc"}, PathOutsideWorkspace, "leaves the session's workspace"),
]


async def test_a_bad_command_request_is_refused(session: SessionPort) -> None:
    for command, kwargs, refusal, message in BAD_COMMANDS:
        with pytest.raises(refusal, match=message):
            await session.run_command(command, **kwargs)


async def test_a_command_whose_caller_goes_away_is_stopped(session: SessionPort) -> None:
    up = asyncio.Event()
    running = asyncio.ensure_future(session.run_command(
        "echo up; sleep 3; touch /home/user/survived", emit=lambda _e: up.set()))
    await asyncio.wait_for(up.wait(), 30)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    await asyncio.sleep(4)

    assert "survived" not in {f.path for f in await session.list_files()}, \
        "the command went on running after its caller had gone"


async def test_the_sandbox_says_what_it_is_and_uses(session: SessionPort) -> None:
    info = session.sandbox_info()
    usage = await session.usage()

    assert info.backend == "docker" and info.container_id
    assert usage.memory_limit_bytes > 0
    assert await session.egress_attempts() == [], "the default profile has no network"


async def test_metadata_is_written_kept_and_cleared(session: SessionPort) -> None:
    assert await session.write_file("m/a.txt", b"1", {"Author": "mish"}) == 1
    assert (await session.stat_path("m/a.txt")).metadata == {"author": "mish"}
    moved = await session.move_path("m/a.txt", "m/b.txt")
    assert moved.metadata == {"author": "mish"}
    assert [e.metadata for e in await session.list_dir("m")] == [{"author": "mish"}]
    await session.write_file("m/b.txt", b"2")
    assert (await session.stat_path("m/b.txt")).metadata is None
    with pytest.raises(InvalidRequest, match="invalid metadata key"):
        await session.write_file("m/c.txt", b"3", {"bad key": "v"})
    with pytest.raises(FileMissing):
        await session.stat_path("m/c.txt")


async def test_links_are_followed_inside_the_workspace_only(session: SessionPort) -> None:
    await session.write_file("l/real.txt", b"hello")
    made = await session.run_command("ln -s real.txt l/in && ln -s /etc/passwd l/out")
    assert made.exit_code == 0, made.stderr
    inside = await session.stat_path("l/in")
    assert (inside.kind, inside.size, inside.resolved) == ("file", 5, "l/real.txt")
    out = await session.stat_path("l/out")
    assert (out.kind, out.target, out.resolved) == ("symlink", "/etc/passwd", None)
    assert [(e.path, e.kind) for e in await session.list_dir("l")] == [
        ("l/in", "file"), ("l/out", "symlink"), ("l/real.txt", "file")]
    assert await session.read_file("l/in", 100) == b"hello"
