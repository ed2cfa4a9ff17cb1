"""Terminals and command input through a running gateway: the terminal WebSocket (a real
client), reattaching, refusals, and the HTTP input, close and resize of a command."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websockets
from websockets.asyncio.client import ClientConnection, connect

from tests.conftest import GatewayProcess


@pytest.fixture(scope="module")
def sid(alpha: httpx.Client) -> Iterator[str]:
    answer = alpha.post("/v1/sessions", json={})
    assert answer.status_code == 201, answer.text
    yield answer.json()["id"]
    alpha.delete(f"/v1/sessions/{answer.json()['id']}")


def terminal_url(gateway: GatewayProcess, sid: str, query: str = "") -> str:
    return gateway.url.replace("http://", "ws://") + f"/v1/sessions/{sid}/terminal{query}"


async def read_until(ws: ClientConnection, wanted: str) -> tuple[str, list[dict[str, Any]]]:
    """The output text until ``wanted`` shows (or the exit frame), and the frames."""
    frames: list[dict[str, Any]] = []
    async with asyncio.timeout(60):
        while True:
            frame = json.loads(await ws.recv())
            frames.append(frame)
            text = "".join(f["data"] for f in frames if f["type"] == "output")
            if wanted in text or frame["type"] == "exit":
                return text, frames


async def test_terminal_runs_a_shell_sized_and_resized_to_its_exit(
        gateway: GatewayProcess, sid: str) -> None:
    async with connect(terminal_url(gateway, sid, "?cols=100&rows=30"),
                       additional_headers=gateway.headers()) as ws:
        started = json.loads(await ws.recv())
        assert started["type"] == "started" and started["id"]
        await ws.send(json.dumps({"type": "input",
                                  "data": "echo size=$(tput cols)x$(tput lines)\n"}))
        await read_until(ws, "size=100x30")
        await ws.send(json.dumps({"type": "resize", "cols": 120, "rows": 40}))
        await ws.send(json.dumps({"type": "input", "data": "echo now=$(tput cols); exit 5\n"}))
        text, frames = await read_until(ws, "never")
        assert "now=120" in text
        assert frames[-1] == {"type": "exit", "exit_code": 5, "status": "ok"}
        with pytest.raises(websockets.ConnectionClosedOK):
            await ws.recv()
    # audited as a command (the record is appended once the exit frame is sent)
    deadline = time.monotonic() + 10
    while not (found := [r for r in gateway.audit_records()
                         if r["execution_id"] == started["id"]]):
        assert time.monotonic() < deadline, "no audit record for the terminal"
        await asyncio.sleep(0.05)
    assert found[0]["extra"] == {"kind": "command", "exit_code": 5}


async def test_terminal_outlives_its_socket_and_is_reattached_by_id(
        gateway: GatewayProcess, sid: str) -> None:
    async with connect(terminal_url(gateway, sid, "?cmd=bash%20-i"),
                       additional_headers=gateway.headers()) as ws:
        terminal_id = json.loads(await ws.recv())["id"]
        await ws.send(json.dumps({"type": "input", "data": "export MARK=kept-across\n"}))
        await read_until(ws, "$ ")
    # token in the query, as a browser sends it
    key = gateway.keys["alpha"]
    async with connect(terminal_url(gateway, sid, f"?id={terminal_id}&token={key}")) as ws:
        assert json.loads(await ws.recv()) == {"type": "started", "id": terminal_id}
        await ws.send(json.dumps({"type": "input", "data": "echo got=$MARK\n"}))
        await read_until(ws, "got=kept-across")
        await ws.send(json.dumps({"type": "kill"}))
        _, frames = await read_until(ws, "never")
        assert frames[-1] == {"type": "exit", "exit_code": None, "status": "killed"}
    async with connect(terminal_url(gateway, sid, f"?id={terminal_id}"),
                       additional_headers=gateway.headers()) as ws:  # gone with its kill
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4404


async def test_terminal_refusals_close_with_their_codes(gateway: GatewayProcess,
                                                       sid: str) -> None:
    cases = [(terminal_url(gateway, sid, "?id=term-none"), gateway.headers(), 4404),
             (terminal_url(gateway, sid, "?cols=0"), gateway.headers(), 4400),
             (terminal_url(gateway, sid), {"Authorization": "Bearer wrong"}, 4401),
             (terminal_url(gateway, "no-such-session"), gateway.headers(), 4404)]
    for url, headers, code in cases:
        async with connect(url, additional_headers=headers) as ws:
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == code, url
    async with connect(terminal_url(gateway, sid), additional_headers=gateway.headers()) as ws:
        terminal_id = json.loads(await ws.recv())["id"]
        await ws.send(json.dumps({"type": "shout"}))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                await ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4422
    async with connect(terminal_url(gateway, sid, f"?id={terminal_id}"),
                       additional_headers=gateway.headers()) as ws:  # it ran on
        await ws.recv()
        await ws.send(json.dumps({"type": "kill"}))
        await read_until(ws, "never")


def test_http_command_takes_stdin_and_a_terminal(alpha: httpx.Client, sid: str) -> None:
    answers: dict[str, httpx.Response] = {}

    def run(name: str, body: dict[str, Any]) -> None:
        answers[name] = alpha.post(f"/v1/sessions/{sid}/commands", json=body, timeout=60)

    cat = threading.Thread(target=run, args=("cat", {"cmd": "cat", "id": "h-cat",
                                                     "stdin": True}))
    cat.start()
    for _ in range(200):
        sent = alpha.post(f"/v1/sessions/{sid}/commands/h-cat/input", json={"data": "héllo\n"})
        if sent.status_code != 404:  # not started yet
            break
    assert sent.status_code == 204, sent.text
    assert alpha.post(f"/v1/sessions/{sid}/commands/h-cat/close-input").status_code == 204
    cat.join(60)
    assert answers["cat"].json()["stdout"] == "héllo\n"

    pty = threading.Thread(target=run, args=("pty", {
        "cmd": "read line; echo cols=$(tput cols) got=$line", "id": "h-pty",
        "pty": {"cols": 70, "rows": 20}}))
    pty.start()
    for _ in range(200):
        resized = alpha.post(f"/v1/sessions/{sid}/commands/h-pty/resize",
                             json={"cols": 90, "rows": 20})
        if resized.status_code != 404:
            break
    assert resized.status_code == 204, resized.text
    assert alpha.post(f"/v1/sessions/{sid}/commands/h-pty/input",
                      json={"data": "yes\n"}).status_code == 204
    pty.join(60)
    assert "cols=90 got=yes" in answers["pty"].json()["stdout"]

    gone = alpha.post(f"/v1/sessions/{sid}/commands/h-none/input", json={"data": "x"})
    assert gone.status_code == 404 and "no shell command 'h-none'" in gone.json()["detail"]
    bad = alpha.post(f"/v1/sessions/{sid}/commands/h-none/resize", json={"cols": 0, "rows": 5})
    assert bad.status_code in (400, 422)


async def test_a_client_too_far_behind_is_detached_and_the_terminal_runs_on(
        gateway: GatewayProcess, sid: str) -> None:
    async with connect(terminal_url(gateway, sid), additional_headers=gateway.headers(),
                       max_queue=1) as ws:
        terminal_id = json.loads(await ws.recv())["id"]
        await ws.send(json.dumps({"type": "input", "data": "yes flooding-the-terminal\n"}))
        await asyncio.sleep(5)  # not reading: the server's frames for it pile up
        with pytest.raises(websockets.ConnectionClosed) as closed:
            async with asyncio.timeout(60):
                while True:
                    await ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
    async with connect(terminal_url(gateway, sid, f"?id={terminal_id}"),
                       additional_headers=gateway.headers()) as ws:
        assert json.loads(await ws.recv())["id"] == terminal_id
        await ws.send(json.dumps({"type": "kill"}))
        _, frames = await read_until(ws, "never-shown")
        assert frames[-1]["type"] == "exit" and frames[-1]["status"] == "killed"
