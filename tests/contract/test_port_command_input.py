"""A command's input through the port: stdin, a terminal and its size, and their refusals, the
same wherever the session runs."""

from __future__ import annotations

import asyncio

import pytest

from kernel_pool import (
    CommandInputClosed,
    CommandNotFound,
    CommandResult,
    PtySize,
    SessionPort,
    StreamEvent,
)


async def _until(seen: list[StreamEvent], wanted: str) -> None:
    for _ in range(600):
        if wanted in "".join(event.text for event in seen):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{wanted!r} never came: {seen}")


def _start(session: SessionPort, command: str, command_id: str, seen: list[StreamEvent],
           started: asyncio.Event, **options: object) -> asyncio.Future[CommandResult]:
    return asyncio.ensure_future(session.run_command(
        command, command_id=command_id, emit=seen.append, on_start=started.set,
        **options))  # type: ignore[arg-type]


async def test_a_command_reads_what_is_sent_to_its_stdin(session: SessionPort) -> None:
    seen: list[StreamEvent] = []
    started = asyncio.Event()
    running = _start(session, "cat", "c-cat", seen, started, stdin=True)
    await asyncio.wait_for(started.wait(), 30)
    await session.send_command_input("c-cat", b"Hello,\nWorld!")
    await _until(seen, "Hello,\nWorld!")
    await session.close_command_input("c-cat")

    result = await asyncio.wait_for(running, 30)
    assert (result.exit_code, result.stdout) == (0, "Hello,\nWorld!")


async def test_a_terminal_takes_input_and_a_new_size(session: SessionPort) -> None:
    seen: list[StreamEvent] = []
    started = asyncio.Event()
    running = _start(session, "bash -i", "c-pty", seen, started, pty=PtySize(cols=90, rows=20))
    await asyncio.wait_for(started.wait(), 30)
    await session.send_command_input("c-pty", b"echo at $(tput cols)\n")
    await _until(seen, "at 90")
    await session.resize_command("c-pty", PtySize(cols=120, rows=20))
    await session.send_command_input("c-pty", b"echo now $(tput cols); exit 4\n")

    result = await asyncio.wait_for(running, 30)
    assert result.exit_code == 4
    assert "now 120" in result.stdout and {event.type for event in seen} == {"stdout"}


async def test_input_to_a_command_that_takes_none_is_refused(session: SessionPort) -> None:
    with pytest.raises(CommandNotFound):
        await session.send_command_input("c-none", b"x")
    with pytest.raises(CommandNotFound):
        await session.close_command_input("c-none")
    seen: list[StreamEvent] = []
    started = asyncio.Event()
    running = _start(session, "sleep 30", "c-sleep", seen, started)
    await asyncio.wait_for(started.wait(), 30)
    with pytest.raises(CommandInputClosed, match="without stdin"):
        await session.send_command_input("c-sleep", b"x")
    with pytest.raises(CommandInputClosed, match="without a terminal"):
        await session.resize_command("c-sleep", PtySize(cols=10, rows=10))
    await session.kill_command("c-sleep")
    await asyncio.wait_for(running, 30)


async def test_a_command_may_run_in_the_sandboxs_own_folders(session: SessionPort) -> None:
    result = await session.run_command("pwd", cwd="/")
    assert (result.exit_code, result.stdout) == (0, "/\n")
