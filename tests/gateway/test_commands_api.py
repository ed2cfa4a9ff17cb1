"""Shell commands through a running gateway: HTTP, WebSocket, the Python client, MCP tools."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from websockets.asyncio.client import connect

from gateway.client import AsyncSandbox, InvalidRequestError, NotFoundError, Sandbox
from tests.conftest import GatewayProcess
from tests.gateway.test_ws import collect, ws_url


@pytest.fixture(scope="module")
def sid(alpha: httpx.Client) -> Iterator[str]:
    """A session with ``SESSION_VAR`` in its environment, which commands see too."""
    answer = alpha.post("/v1/sessions", json={"env": {"SESSION_VAR": "from-session"}})
    assert answer.status_code == 201, answer.text
    yield answer.json()["id"]
    alpha.delete(f"/v1/sessions/{answer.json()['id']}")


@pytest.fixture(scope="module")
async def sandbox(gateway: GatewayProcess) -> AsyncIterator[AsyncSandbox]:
    sbx = await AsyncSandbox.create(base_url=gateway.url, api_key=gateway.keys["alpha"])
    yield sbx
    await sbx.close()


def command(client: httpx.Client, sid: str, **body: object) -> httpx.Response:
    return client.post(f"/v1/sessions/{sid}/commands", json=body)


def test_http_command_answers_contract_shape(alpha: httpx.Client, sid: str) -> None:
    answer = command(alpha, sid, cmd="echo hi; echo oops >&2; exit 7")
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert set(result) >= {"exit_code", "stdout", "stderr", "truncated", "status",
                           "duration_ms"}
    assert (result["exit_code"], result["stdout"], result["stderr"]) == (7, "hi\n", "oops\n")
    assert (result["status"], result["truncated"]) == ("ok", False)


def test_http_command_sees_session_and_request_env(alpha: httpx.Client, sid: str) -> None:
    result = command(alpha, sid, cmd='echo "$SESSION_VAR $ASKED"',
                     env={"ASKED": "per-command"}).json()
    assert result["stdout"] == "from-session per-command\n"


def test_http_command_timeout_kills_background_child(alpha: httpx.Client, sid: str) -> None:
    started = time.monotonic()
    result = command(alpha, sid, cmd="sleep 100 & sleep 100", timeout_s=1).json()
    assert (result["status"], result["exit_code"]) == ("timeout", None)
    assert time.monotonic() - started < 10
    ps = command(alpha, sid, cmd="ps -eo args 2>/dev/null || ls /proc").json()
    assert "sleep 100" not in ps["stdout"]


@pytest.mark.parametrize(("body", "status", "words"), [
    ({"cmd": ""}, 400, "cmd is empty"),
    ({"cmd": "  \n"}, 400, "cmd is empty"),
    ({"cmd": "ls", "timeout_s": 0}, 422, "greater than 0"),
    ({"cmd": "ls", "timeout_s": 99_999}, 400, "timeout_s must be"),
    ({"cmd": "ls", "cwd": "../../etc"}, 400, "leaves the session's workspace"),
    ({"cmd": "ls", "env": {"BAD NAME": "x"}}, 422, "pattern"),
    ({}, 422, "cmd"),
])
def test_http_command_refuses_bad_input(alpha: httpx.Client, sid: str, body: dict[str, object],
                                        status: int, words: str) -> None:
    answer = command(alpha, sid, **body)
    assert answer.status_code == status, answer.text
    assert words in json.dumps(answer.json()["detail"])


def test_http_command_on_missing_or_deleted_session_is_404(alpha: httpx.Client) -> None:
    created = alpha.post("/v1/sessions", json={}).json()["id"]
    assert alpha.delete(f"/v1/sessions/{created}").status_code == 204
    answer = command(alpha, created, cmd="ls")
    assert answer.status_code == 404 and answer.json()["detail"]
    assert command(alpha, "no-such-session", cmd="ls").status_code == 404


def test_http_command_of_other_tenant_is_404(gateway: GatewayProcess, sid: str) -> None:
    with httpx.Client(base_url=gateway.url, headers=gateway.headers("beta")) as beta:
        assert command(beta, sid, cmd="ls").status_code == 404


def test_http_command_is_audited(gateway: GatewayProcess, alpha: httpx.Client,
                                 sid: str) -> None:
    command(alpha, sid, cmd="echo audited-command-42")
    # Read-only, not through `replgate audit`: a second process's read-write connection
    # closing while the gateway runs is what test_api's audit test covers.
    # The record is appended after the answer is sent: wait for it (bounded).
    deadline = time.monotonic() + 10
    while True:
        rows = gateway.audit_records()
        found = [r for r in rows if r["code"] == "echo audited-command-42"]
        if found or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert found and found[-1]["extra"] == {"kind": "command", "exit_code": 0}
    assert found[-1]["session_id"] == sid and found[-1]["status"] == "ok"


async def test_ws_command_streams_stdout_then_done_with_exit_code(gateway: GatewayProcess,
                                                                  sid: str) -> None:
    async with connect(ws_url(gateway, sid), additional_headers=gateway.headers()) as ws:
        await ws.send(json.dumps({"type": "command", "id": "c-1",
                                  "cmd": "echo one; sleep 1; echo two >&2; exit 3"}))
        frames = await collect(ws, "c-1")
    assert [(f["type"], f.get("text")) for f in frames[:-1]] == [
        ("stdout", "one\n"), ("stderr", "two\n")]
    assert frames[1]["_at"] - frames[0]["_at"] > 0.5  # streamed, not sent at the end
    done = frames[-1]
    assert (done["type"], done["exit_code"], done["status"]) == ("done", 3, "ok")
    assert done["command_id"] == "c-1"


async def test_ws_command_kill_stops_it(gateway: GatewayProcess, sid: str) -> None:
    async with connect(ws_url(gateway, sid), additional_headers=gateway.headers()) as ws:
        await ws.send(json.dumps({"type": "command", "id": "c-kill", "cmd": "sleep 100"}))
        await asyncio.sleep(1)
        await ws.send(json.dumps({"type": "kill_command", "id": "c-kill"}))
        frames = await collect(ws, "c-kill")
    assert next(f for f in frames if f["type"] == "command_killed")["killed"] is True
    assert frames[-1]["status"] == "killed"


async def test_ws_command_bad_input_is_rejected(gateway: GatewayProcess, sid: str) -> None:
    async with connect(ws_url(gateway, sid), additional_headers=gateway.headers()) as ws:
        await ws.send(json.dumps({"type": "command", "id": "c-empty", "cmd": ""}))
        frames = await collect(ws, "c-empty")
    assert frames[-1]["type"] == "rejected" and frames[-1]["status_code"] == 400


async def test_client_commands_run_streams_to_callbacks(sandbox: AsyncSandbox) -> None:
    seen: list[tuple[str, str]] = []

    async def on_stderr(text: str) -> None:
        seen.append(("err", text))

    result = await sandbox.commands.run(
        "echo $GREETING; echo warn >&2; exit 1", envs={"GREETING": "hello"},
        on_stdout=lambda text: seen.append(("out", text)), on_stderr=on_stderr)
    assert (result.exit_code, result.stdout, result.stderr) == (1, "hello\n", "warn\n")
    assert sorted(seen) == [("err", "warn\n"), ("out", "hello\n")]


async def test_client_commands_background_wait_and_kill(sandbox: AsyncSandbox) -> None:
    await sandbox.files.write("sub/x.txt", "in a folder")
    waited = await sandbox.commands.run("sleep 1; cat x.txt", background=True, cwd="sub")
    killed = await sandbox.commands.run("sleep 100", background=True)
    await asyncio.sleep(0.5)
    assert await killed.kill() is True
    assert (await killed.wait()).status == "killed"
    assert (await waited.wait()).stdout == "in a folder"
    assert await killed.kill() is False


async def test_client_commands_run_timeout_and_refusal(sandbox: AsyncSandbox) -> None:
    result = await sandbox.commands.run("sleep 30", timeout=1)
    assert (result.status, result.exit_code) == ("timeout", None)
    with pytest.raises(InvalidRequestError, match="cmd is empty"):
        await sandbox.commands.run(" ")


def test_sync_client_commands_run_and_background(gateway: GatewayProcess) -> None:
    with Sandbox.create(base_url=gateway.url, api_key=gateway.keys["alpha"]) as sbx:
        assert sbx.commands.run("echo sync").stdout == "sync\n"
        handle = sbx.commands.run("echo later", background=True)
        assert handle.wait().stdout == "later\n"


async def test_tool_run_shell_gives_output_and_exit_code(sandbox: AsyncSandbox) -> None:
    result = await sandbox.tools.call("run_shell", {"cmd": "printf 'a\\nb\\n' | wc -l; exit 2"})
    assert result.is_error is False
    assert "2\n" in result.text and "[exit code 2]" in result.text
    refused = await sandbox.tools.call("run_shell", {"cmd": " "})
    assert refused.is_error and "cmd is empty" in refused.text


async def test_client_commands_kill_of_unknown_id_is_false(gateway: GatewayProcess,
                                                           sandbox: AsyncSandbox) -> None:
    assert await sandbox.commands.kill("cmd-none") is False
    gone = await AsyncSandbox.create(base_url=gateway.url, api_key=gateway.keys["alpha"])
    await gone.close()
    with pytest.raises(NotFoundError):
        await gone.commands.run("ls")
