"""Commands that take input (stdin, terminals), under runc and gVisor, and long output lines."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest
from kp_support import pausing_pool, processes, run_ok

from kernel_pool import (
    CommandInputClosed,
    CommandNotFound,
    KernelPool,
    PtySize,
    Session,
    SessionClosed,
)
from kernel_pool._commands import CommandRun
from kernel_pool.backends.docker._commands import KILL_GRACE_S
from kernel_pool.events import CommandResult, StreamEvent


@pytest.fixture(scope="module")
async def input_pool(state_root: Path, docker_client: docker.DockerClient,
                     ) -> AsyncIterator[KernelPool]:
    async with pausing_pool(state_root, docker_client, "input") as pool:
        yield pool


@pytest.fixture(params=["default", "hostile"], ids=["runc", "gvisor"])
async def any_session(request: pytest.FixtureRequest,
                      input_pool: KernelPool) -> AsyncIterator[Session]:
    session = await input_pool.create_session(request.param)
    yield session
    if not session.closed:
        await input_pool.delete_session(session.id)


class Started:
    """A command running in the background, its output gathered as it comes."""

    def __init__(self, session: Session, command: str, **options: object) -> None:
        self.session = session
        self.output: list[StreamEvent] = []
        self.run: CommandRun = session.prepare_command(command, **options)  # type: ignore[arg-type]
        self.started = asyncio.Event()
        self.task = asyncio.ensure_future(session.run_prepared(
            self.run, self.output.append, self.started.set))

    @property
    def text(self) -> str:
        return "".join(event.text for event in self.output)

    async def seen(self, wanted: str) -> None:
        async with asyncio.timeout(30):
            while wanted not in self.text:
                if self.task.done():
                    raise AssertionError(f"ended before {wanted!r}: {self.text!r}")
                await asyncio.sleep(0.05)

    async def result(self) -> CommandResult:
        return await asyncio.wait_for(self.task, 60)


async def test_stdin_is_written_in_order_and_closed(any_session: Session) -> None:
    cat = Started(any_session, "cat; echo done", stdin=True)
    await cat.started.wait()
    await any_session.send_command_input(cat.run.id, b"Hello, ")
    await any_session.send_command_input(cat.run.id, b"World!\n")
    await cat.seen("Hello, World!\n")
    await any_session.close_command_input(cat.run.id)
    await any_session.close_command_input(cat.run.id)  # twice: no error
    result = await cat.result()
    assert (result.exit_code, result.stdout) == (0, "Hello, World!\ndone\n")
    assert all(event.type == "stdout" for event in cat.output)


async def test_input_is_refused_without_stdin_or_once_closed(shared_session: Session) -> None:
    with pytest.raises(CommandNotFound):
        await shared_session.send_command_input("no-such-command", b"x")
    with pytest.raises(CommandNotFound):
        await shared_session.resize_command("no-such-command", PtySize(cols=10, rows=10))
    sleeper = Started(shared_session, "sleep 30")
    await sleeper.started.wait()
    with pytest.raises(CommandInputClosed, match="without stdin"):
        await shared_session.send_command_input(sleeper.run.id, b"x")
    with pytest.raises(CommandInputClosed, match="without a terminal"):
        await shared_session.resize_command(sleeper.run.id, PtySize(cols=10, rows=10))
    await shared_session.kill_command(sleeper.run.id)
    await sleeper.result()
    cat = Started(shared_session, "cat", stdin=True)
    await cat.started.wait()
    await shared_session.close_command_input(cat.run.id)
    with pytest.raises(CommandInputClosed, match="was closed"):
        await shared_session.send_command_input(cat.run.id, b"late")
    assert (await cat.result()).exit_code == 0


async def test_terminal_has_its_size_job_control_and_resizes(any_session: Session) -> None:
    shell = Started(any_session, "bash -i", pty=PtySize(cols=100, rows=30))
    await shell.started.wait()
    await any_session.send_command_input(shell.run.id, b"echo size=$(tput cols)x$(tput lines)\n")
    await shell.seen("size=100x30")
    await any_session.resize_command(shell.run.id, PtySize(cols=132, rows=40))
    await any_session.send_command_input(
        shell.run.id, b"tty; sleep 300 & jobs; echo cols=$(tput cols)\n")
    await shell.seen("cols=132")
    await shell.seen("Running")  # jobs lists the background job: job control works
    assert "no job control" not in shell.text
    if any_session.profile.runtime == "runc":  # gVisor's ttyname finds no name for it
        assert "/dev/pts/" in shell.text
    await any_session.send_command_input(shell.run.id, b"exit 3\n")
    result = await shell.result()
    assert result.exit_code == 3
    assert "size=100x30" in result.stdout and result.stderr == ""


async def test_terminal_kill_ends_its_jobs(any_session: Session) -> None:
    shell = Started(any_session, "bash -i", pty=PtySize())
    await shell.started.wait()
    await any_session.send_command_input(shell.run.id, b"sleep 301 & echo started\n")
    await shell.seen("started\r\n")
    asked = time.monotonic()
    assert await any_session.kill_command(shell.run.id)
    result = await shell.result()
    assert result.status == "killed"
    # The stop reached the terminal's wrapper, which ended its session before it exited: no
    # grace waited out for the hard kill (gVisor hands a terminal exec's signals to the
    # shell, which ignores SIGTERM; the hangup that followed the hard kill then raced this).
    assert time.monotonic() - asked < KILL_GRACE_S
    assert not [p for p in await processes(any_session) if "sleep 301" in p[2]]


async def test_command_in_a_folder_outside_the_workspace(shared_session: Session) -> None:
    result = await shared_session.run_command("pwd", cwd="/")
    assert (result.exit_code, result.stdout) == (0, "/\n")
    result = await shared_session.run_command("pwd", cwd="/usr/../tmp")
    assert result.stdout == "/tmp\n"


async def test_long_output_lines_arrive_whole_under_the_stream_cap(
        shared_session: Session) -> None:
    line = "a" * 8191
    result = await shared_session.run_command(f"printf '{line}\\342'")
    assert result.stdout == line + "\ufffd"
    assert not result.truncated
    # The stream cap still holds for one long line.
    result = await shared_session.run_command("head -c 65536 /dev/zero | tr '\\0' b")
    assert result.truncated
    assert len(result.stdout) < 30_000


async def test_command_whose_sandbox_is_deleted_raises_session_closed(
        input_pool: KernelPool) -> None:
    session = await input_pool.create_session()
    sleeper = Started(session, "sleep 60")
    await sleeper.started.wait()
    await input_pool.delete_session(session.id)
    with pytest.raises(SessionClosed):
        await sleeper.result()


async def test_terminal_jobs_outlive_an_execution_beside_them(any_session: Session) -> None:
    shell = Started(any_session, "bash -i", pty=PtySize())
    await shell.started.wait()
    await any_session.send_command_input(shell.run.id, b"sleep 302 & echo started\n")
    await shell.seen("started\r\n")
    await run_ok(any_session, "print(1)")  # its clean-up spares the terminal's processes
    await any_session.send_command_input(shell.run.id, b"jobs; exit\n")
    await shell.seen("Running")
    assert (await shell.result()).exit_code == 0


async def test_command_in_a_missing_folder_fails_as_a_command(shared_session: Session) -> None:
    result = await shared_session.run_command("pwd", cwd="/no/such/folder")
    assert result.exit_code not in (0, None), result
    assert result.status == "ok" and "/no/such/folder" in result.stdout + result.stderr
