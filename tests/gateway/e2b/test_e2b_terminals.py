"""E2B's commands with stdin, its terminals (``sandbox.pty``) and commands' edge cases, through
the unmodified SDK, sync and async."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b import AsyncSandbox, CommandExitException, Sandbox, TimeoutException
from e2b.sandbox.commands.command_handle import PtySize

pytestmark = pytest.mark.usefixtures("e2b_env")


@pytest.fixture(scope="module")
def sandbox(e2b_env: dict[str, str]) -> Iterator[Sandbox]:
    sbx = Sandbox.create()
    yield sbx
    sbx.kill()


def test_stdin_is_sent_and_closed(sandbox: Sandbox) -> None:
    cmd = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.send_stdin(cmd.pid, "Hello,\n")
    cmd.send_stdin(b"World!")
    for stdout, _, _ in cmd:
        assert stdout.startswith("Hello,\n")
        break
    cmd.close_stdin()
    result = cmd.wait()
    assert (result.exit_code, result.stdout) == (0, "Hello,\nWorld!")


def test_stdin_is_streamed(sandbox: Sandbox) -> None:
    cmd = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.stream_input(cmd.pid, ["one ", b"two ", "three"])
    sandbox.commands.close_stdin(cmd.pid)
    assert cmd.wait().stdout == "one two three"


def test_stdin_to_a_command_without_it_is_refused(sandbox: Sandbox) -> None:
    cmd = sandbox.commands.run("sleep 30", background=True)
    with pytest.raises(Exception, match="without stdin"):
        sandbox.commands.send_stdin(cmd.pid, "x")
    assert cmd.kill()


def test_terminal_in_root_with_envs_resize_connect_and_kill(sandbox: Sandbox) -> None:
    terminal = sandbox.pty.create(PtySize(cols=80, rows=24), envs={"ABC": "123"}, cwd="/")
    sandbox.pty.send_stdin(terminal.pid, b"echo at=$PWD abc=$ABC cols=$(tput cols)\n")
    terminal.disconnect()
    again = sandbox.pty.connect(terminal.pid)
    sandbox.pty.resize(terminal.pid, PtySize(cols=100, rows=24))
    sandbox.pty.send_stdin(terminal.pid, b"echo now=$(tput cols)\nexit\n")
    output: list[bytes] = []
    result = again.wait(on_pty=output.append)
    text = b"".join(output).decode()
    assert result.exit_code == 0
    assert "now=100" in text

    other = sandbox.pty.create(PtySize(cols=80, rows=24))
    assert sandbox.pty.kill(other.pid)
    assert not sandbox.pty.kill(999_999)
    with pytest.raises(CommandExitException):
        sandbox.commands.run(f"kill -0 {other.pid}")


def test_terminal_output_is_pty_data(sandbox: Sandbox) -> None:
    terminal = sandbox.pty.create(PtySize(cols=80, rows=24), envs={"ABC": "123"}, cwd="/")
    sandbox.pty.send_stdin(terminal.pid, b"echo at=$PWD abc=$ABC\nexit 7\n")
    output: list[bytes] = []
    with pytest.raises(CommandExitException) as ended:
        terminal.wait(on_pty=output.append)
    assert ended.value.exit_code == 7
    assert "at=/ abc=123" in b"".join(output).decode()


def test_long_line_with_broken_utf8_arrives_whole(sandbox: Sandbox) -> None:
    result = sandbox.commands.run('printf "' + "a" * 8191 + '\\xe2"')
    assert result.stdout == "a" * 8191 + "\ufffd"


def test_command_in_the_sandboxs_own_folder(sandbox: Sandbox) -> None:
    assert sandbox.commands.run("pwd", cwd="/usr").stdout == "/usr\n"


def test_sandbox_killed_while_a_command_runs_raises_timeout() -> None:
    sbx = Sandbox.create()
    cmd = sbx.commands.run("sleep 60", background=True)
    sbx.kill()
    with pytest.raises(TimeoutException, match="sandbox was killed or reached its end of life"):
        cmd.wait()


async def test_async_stdin_and_terminal() -> None:
    sbx = await AsyncSandbox.create()
    try:
        cmd = await sbx.commands.run("cat", background=True, stdin=True)
        await sbx.commands.send_stdin(cmd.pid, "async in")
        await sbx.commands.close_stdin(cmd.pid)
        result = await cmd.wait()
        assert result.stdout == "async in"

        output: list[bytes] = []
        terminal = await sbx.pty.create(PtySize(cols=90, rows=24), on_data=output.append)
        await sbx.pty.resize(terminal.pid, PtySize(cols=110, rows=30))
        await sbx.pty.send_stdin(terminal.pid, b"echo size=$(tput cols)x$(tput lines)\nexit\n")
        assert (await terminal.wait()).exit_code == 0
        assert "size=110x30" in b"".join(output).decode()

        sleeper = await sbx.commands.run("sleep 60", background=True)
        await sbx.kill()
        with pytest.raises(TimeoutException, match="sandbox was killed"):
            await sleeper.wait()
    finally:
        await sbx.kill()
