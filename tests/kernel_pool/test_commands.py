"""Shell commands beside the kernel: exit codes, env, cwd, timeouts, kills, floods, bombs."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import docker
from kp_support import SESSION_ENV, pausing_pool, processes, run_ok

from kernel_pool import Session
from kernel_pool.events import StreamEvent


async def test_command_runs_in_workspace_as_sandbox_user_with_env(
        shared_session: Session) -> None:
    await run_ok(shared_session, "import os; os.makedirs('sub', exist_ok=True)")
    result = await shared_session.run_prepared(shared_session.prepare_command(
        'pwd; id -u; echo "$GREETING|$REPLGATE_TEST_GREETING"', env={"GREETING": "hi"},
        cwd="sub"))
    assert result.stdout.splitlines() == [
        "/home/user/sub", "1000", f"hi|{SESSION_ENV['REPLGATE_TEST_GREETING']}"]
    # Absolute: where the sandbox has the workspace, or where it had it (a link to it now).
    for folder in ("/home/user/sub", "/workspace/sub"):
        absolute = await shared_session.run_prepared(shared_session.prepare_command(
            "pwd", cwd=folder))
        assert absolute.stdout == "/home/user/sub\n", folder
    default = await shared_session.run_prepared(shared_session.prepare_command("pwd"))
    assert default.stdout == "/home/user\n"


async def test_command_has_no_network(shared_session: Session) -> None:
    result = await shared_session.run_prepared(shared_session.prepare_command(
        "python -c \"import socket; socket.create_connection(('1.1.1.1', 53), 3)\""))
    assert result.exit_code != 0
    assert "unreachable" in result.stderr.lower() or "error" in result.stderr.lower()


async def test_command_streams_output_as_it_comes(shared_session: Session) -> None:
    seen: list[tuple[float, StreamEvent]] = []
    started = time.monotonic()
    result = await shared_session.run_prepared(
        shared_session.prepare_command("echo first; sleep 1; echo second"),
        lambda event: seen.append((time.monotonic() - started, event)))
    assert result.stdout == "first\nsecond\n"
    assert [event.text for _, event in seen] == ["first\n", "second\n"]
    assert seen[0][0] < seen[1][0] - 0.5  # the first line came before the sleep ended


async def test_command_timeout_kills_its_process_group(session: Session) -> None:
    started = time.monotonic()
    result = await session.run_prepared(session.prepare_command(
        "sleep 100 & echo started; sleep 100", timeout_s=2))
    assert result.status == "timeout"
    assert result.exit_code is None
    assert result.stdout == "started\n"
    assert time.monotonic() - started < 10
    assert not [p for p in await processes(session) if "sleep" in p[2]]


async def test_command_whose_pid_is_unknown_is_still_let_go_at_once(session: Session) -> None:
    # The backend's way out when the engine never said the wrapper's pid: stop reading. A
    # plain close left the engine's connection open (the SDK's file object over it lived),
    # so the read waited for the command's own end, here 100 s.
    process = await session.kernel.sandbox.start_command("echo started; sleep 100",
                                                         env={}, cwd="")
    try:
        assert await process.read() == ("stdout", b"started\n")
        started = time.monotonic()
        # As if the pid was never had: no pidfd, and no reader on one (left registered, a
        # closed or exited pidfd would wake the run's event loop without end).
        pidfd = process._pidfd  # type: ignore[attr-defined]
        assert pidfd is not None
        asyncio.get_running_loop().remove_reader(pidfd)
        os.close(pidfd)
        process._pidfd = None  # type: ignore[attr-defined]
        await process.kill()
        assert await asyncio.wait_for(process.read(), 30) is None
        assert time.monotonic() - started < 10
    finally:
        await process.close()
    await run_ok(session, "1")  # its clean-up kills the sleep left behind
    assert not [p for p in await processes(session) if "sleep" in p[2]]


async def test_command_ending_kills_its_background_children(session: Session) -> None:
    result = await session.run_prepared(session.prepare_command("sleep 100 & echo done"))
    assert (result.status, result.exit_code, result.stdout) == ("ok", 0, "done\n")
    assert not [p for p in await processes(session) if "sleep" in p[2]]


async def test_command_is_killed_on_request(session: Session) -> None:
    command = session.prepare_command("echo up; sleep 100")
    running = asyncio.ensure_future(session.run_prepared(command))
    await asyncio.sleep(1)
    assert session.commands[command.id] is command
    assert command.kill() is True
    result = await running
    assert result.status == "killed"
    assert result.stdout == "up\n"
    assert command.id not in session.commands


async def test_command_flood_is_capped_and_spilled(session: Session) -> None:
    result = await session.run_prepared(session.prepare_command(
        "yes 0123456789abcdef | head -c 30000000", timeout_s=60))
    assert result.status == "ok"
    assert result.truncated is True
    assert len(result.stdout) < 2 * session.profile.caps.stream_chars
    assert f".replgate/outputs/{result.id}.txt" in result.stderr
    size = await run_ok(session, f"import os; print(os.path.getsize('.replgate/outputs/"
                                 f"{result.id}.txt'))")
    assert int(size) == 30_000_000


async def test_command_fork_bomb_is_contained(session: Session) -> None:
    result = await session.run_prepared(session.prepare_command(
        "bomb() { bomb | bomb & }; bomb; sleep 5", timeout_s=5))
    assert result.status in ("timeout", "ok")
    assert (await session.execute("21 * 2")).outputs[0].data["text/plain"] == "42"
    assert len(await processes(session)) < 10


async def test_command_runs_beside_a_running_execution(session: Session) -> None:
    handle = session.submit("import time; time.sleep(3); 'slept'")
    await asyncio.sleep(0.5)
    result = await session.run_prepared(session.prepare_command("echo beside"))
    assert result.stdout == "beside\n"
    assert (await handle.result()).outputs[0].data["text/plain"] == "'slept'"


async def test_command_outlives_an_execution_that_ends_beside_it(session: Session) -> None:
    command = session.prepare_command("sleep 3; echo survived")
    running = asyncio.ensure_future(session.run_prepared(command))
    await asyncio.sleep(0.5)
    await run_ok(session, "1")  # its clean-up kills strays, but not a running command
    assert (await running).stdout == "survived\n"


async def test_pause_stops_a_running_command_and_says_so(session: Session) -> None:
    command = session.prepare_command("echo up; sleep 100")
    running = asyncio.ensure_future(session.run_prepared(command))
    await asyncio.sleep(1)
    info = await session.pause()
    result = await asyncio.wait_for(running, 10)
    assert (result.status, result.exit_code, result.stdout) == ("killed", None, "up\n")
    assert result.reason is not None and "paused" in result.reason
    # A stopped command alone does not call for a memory pause: none would keep it.
    assert info.paused_with == "variables"
    assert info.not_kept == {"command 'echo up; sleep 100'":
                             "a running shell command: the pause stopped it"}
    assert session.commands == {}
    assert await run_ok(session, "print('back')") == "back\n"


async def test_idle_pause_and_cull_wait_for_a_running_command(
        state_root: Path, docker_client: docker.DockerClient) -> None:
    async with pausing_pool(state_root, docker_client, "command-idle", pause_after_s=0.5,
                            idle_ttl_s=1.0, cull_interval_s=0.2) as pool:
        session = await pool.create_session()
        result = await session.run_prepared(session.prepare_command("sleep 3; echo done"))
        # Three seconds past both the idle pause (0.5 s) and the idle TTL (1 s): neither came.
        assert (result.status, result.exit_code, result.stdout) == ("ok", 0, "done\n")
        assert not session.paused and not session.closed
