"""Every API through any gateway, on many machines: E2B's SDK, Jupyter's channels and MCP,
each reaching through one gateway a session another gateway made, on a cluster of three nodes
and two gateways (real PostgreSQL, mutual TLS between gateways and nodes: cluster_support).

What these surfaces ask of a session (shell commands, E2B's filesystem service, raw Jupyter
requests, code contexts of other languages) crosses the port to the session's node.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import docker
import httpx
import httpx2
import pytest
from cluster_support import Cluster, gateway_client, running_cluster
from e2b import CommandExitException
from e2b_code_interpreter import AsyncSandbox
from jupyter_client.jsonutil import json_default
from jupyter_client.session import Session as JupyterSession
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, TextContent
from websockets.asyncio.client import ClientConnection, connect

from tests.conftest import GatewayProcess


@pytest.fixture(scope="module")
def cluster(docker_client: docker.DockerClient) -> Iterator[Cluster]:
    with running_cluster(docker_client) as started:
        yield started


def _e2b(gateway: GatewayProcess, key: str) -> dict[str, str]:
    """What points E2B's SDK at ``gateway`` (as E2B_API_URL, E2B_SANDBOX_URL do)."""
    return {"api_url": f"{gateway.url}/e2b", "sandbox_url": f"{gateway.url}/e2b/sandbox",
            "api_key": key}


async def _node_of(gateway: GatewayProcess, key: str, session_id: str) -> str:
    async with gateway_client(gateway, key=key) as http:
        answer = await http.get(f"/v1/sessions/{session_id}")
    assert answer.status_code == 200, answer.text
    node: str = answer.json()["node"]
    return node


async def test_e2b_sdk_made_through_one_gateway_is_served_by_the_other(
        cluster: Cluster) -> None:
    one, two = cluster.gateways
    key = one.keys["alpha"]
    made = await AsyncSandbox.create(**_e2b(one, key))
    try:
        assert await _node_of(one, key, made.sandbox_id) in {n.node_id for n in cluster.nodes}
        there = await AsyncSandbox.connect(made.sandbox_id, **_e2b(two, key))
        assert (await made.run_code("x = 41")).error is None
        seen: list[str] = []
        result = await there.run_code("print('streamed'); x + 1",
                                      on_stdout=lambda out: seen.append(out.line))
        assert result.text == "42" and seen == ["streamed\n"]

        await there.files.make_dir("/home/user/cmd_dir")
        out: list[str] = []
        done = await there.commands.run("echo out; echo err >&2; pwd", cwd="/home/user/cmd_dir",
                                        on_stdout=out.append)
        assert (done.exit_code, done.stderr) == (0, "err\n") and "".join(out) == done.stdout
        assert done.stdout.startswith("out\n") and done.stdout.endswith("/cmd_dir\n")
        # Started through one gateway, killed through the other.
        background = await made.commands.run("sleep 100", background=True)
        assert await there.commands.kill(background.pid)
        assert not await there.commands.kill(background.pid)
        with pytest.raises(CommandExitException):
            await background.wait()  # its own stream, through the first, says it was killed
        assert background.pid not in [p.pid for p in await made.commands.list()]

        await there.files.write("/home/user/reports/a.txt", "from the other gateway")
        assert await made.files.read("reports/a.txt") == "from the other gateway"
        assert await there.files.make_dir("/home/user/reports/2026")
        entries = {e.name: e.type.value for e in await there.files.list("/home/user/reports")}
        assert entries == {"a.txt": "file", "2026": "dir"}
        moved = await there.files.rename("/home/user/reports/a.txt", "/home/user/b.txt")
        assert moved.path == "/home/user/b.txt"
        assert (await there.files.get_info("/home/user/b.txt")).size == len(
            "from the other gateway")
        await there.files.remove("/home/user/reports")
        assert not await made.files.exists("/home/user/reports")

        context = await made.create_code_context(language="bash")
        echoed = await there.run_code("N=6; echo $((N * 7))", context=context)
        assert echoed.logs.stdout == ["42\n"], echoed
        assert context.id in {c.id for c in await there.list_code_contexts()}
    finally:
        await made.kill()


class _Channels:
    """A raw client of ``/api/kernels/{id}/channels`` (JSON frames, jupyter_client's
    messages), as jupyter_server's gateway client speaks it."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.session = JupyterSession(key=b"", username="test")

    async def request(self, msg_type: str, content: dict[str, Any],
                      channel: str = "shell") -> list[dict[str, Any]]:
        """Every message the request caused, until both its reply and its idle came."""
        msg = self.session.msg(msg_type, content)
        await self.ws.send(json.dumps({**msg, "channel": channel}, default=json_default))
        got: list[dict[str, Any]] = []
        replied = idle = False
        deadline = time.monotonic() + 60
        while not (replied and idle):
            frame = await asyncio.wait_for(self.ws.recv(), deadline - time.monotonic())
            message: dict[str, Any] = json.loads(frame)
            if message["parent_header"].get("msg_id") != msg["header"]["msg_id"]:
                continue
            got.append(message)
            replied |= message["channel"] in ("shell", "control")
            idle |= (message["msg_type"] == "status"
                     and message["content"]["execution_state"] == "idle")
        return got


async def test_jupyter_channels_through_the_other_gateway(cluster: Cluster) -> None:
    one, two = cluster.gateways
    key = one.keys["alpha"]
    token = {"Authorization": f"token {key}"}
    async with httpx.AsyncClient(base_url=one.url, headers=token, timeout=60) as http:
        made = await http.post("/api/kernels", json={"name": "python3"})
        assert made.status_code == 201, made.text
        kernel = made.json()["id"]
        try:
            url = f"{two.url.replace('http', 'ws', 1)}/api/kernels/{kernel}/channels"
            async with connect(url, additional_headers=token, max_size=None) as ws:
                channels = _Channels(ws)
                info = await channels.request("kernel_info_request", {})
                reply = next(m for m in info if m["msg_type"] == "kernel_info_reply")
                assert reply["content"]["language_info"]["name"] == "python"
                ran = await channels.request("execute_request", {
                    "code": "answer_value = 6 * 7\nprint(answer_value)", "silent": False,
                    "store_history": True, "user_expressions": {}, "allow_stdin": False,
                    "stop_on_error": True})
                assert [m["content"]["text"] for m in ran if m["msg_type"] == "stream"] == \
                    ["42\n"]
                completed = await channels.request("complete_request",
                                                   {"code": "answer_v", "cursor_pos": 8})
                matches = next(m for m in completed if m["msg_type"] == "complete_reply")
                assert "answer_value" in matches["content"]["matches"]
                inspected = await channels.request("inspect_request", {
                    "code": "answer_value", "cursor_pos": 12, "detail_level": 0})
                found = next(m for m in inspected if m["msg_type"] == "inspect_reply")
                assert found["content"]["found"] is True
        finally:
            await http.delete(f"/api/kernels/{kernel}")


def _texts(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


async def test_mcp_on_one_gateway_and_its_session_through_the_other(cluster: Cluster) -> None:
    one, two = cluster.gateways
    key = one.keys["alpha"]
    headers = {"Authorization": f"Bearer {key}"}
    mcp_http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300))
    async with mcp_http, Client(streamable_http_client(f"{two.url}/mcp",
                                                       http_client=mcp_http)) as mcp, \
            httpx.AsyncClient(base_url=one.url, headers=headers, timeout=60) as http:
        before = {s["id"] for s in (await http.get("/v1/sessions")).json()}
        ran = await mcp.call_tool("execute_python", {"code": "kept = 21\nprint(kept)"})
        assert not ran.is_error and "21" in _texts(ran)
        shell = await mcp.call_tool("run_shell", {"cmd": "echo from-the-shell; pwd"})
        assert not shell.is_error and "from-the-shell" in _texts(shell)
        uploaded = await mcp.call_tool("upload_file", {"path": "note.txt", "content": "hi"})
        assert not uploaded.is_error, _texts(uploaded)
        bash = await mcp.call_tool("execute_code", {"code": "echo $((20 + 1))",
                                                    "language": "bash"})
        assert not bash.is_error and "21" in _texts(bash)
        # The MCP connection's session, through the other gateway's HTTP API.
        (sid,) = {s["id"] for s in (await http.get("/v1/sessions")).json()} - before
        doubled = await http.post(f"/v1/sessions/{sid}/execute", json={"code": "kept * 2"})
        assert doubled.json()["outputs"][-1]["data"]["text/plain"] == "42"
        read = await http.get(f"/v1/sessions/{sid}/files/note.txt")
        assert read.status_code == 200 and read.content == b"hi"
        command = await http.post(f"/v1/sessions/{sid}/commands", json={"cmd": "cat note.txt"})
        assert command.status_code == 200 and command.json()["stdout"] == "hi", command.text


async def test_a_watcher_on_one_gateway_sees_what_runs_through_the_other(
        cluster: Cluster) -> None:
    one, two = cluster.gateways
    headers = one.headers()
    async with httpx.AsyncClient(base_url=one.url, headers=headers, timeout=60) as http:
        created = await http.post("/v1/sessions", json={})
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        try:
            url = two.url.replace("http://", "ws://") + f"/v1/sessions/{sid}/watch"
            async with connect(url, additional_headers=headers) as ws:
                async with asyncio.timeout(30):
                    while json.loads(await ws.recv())["type"] != "history_end":
                        pass
                # The watcher follows the session's node from now on (give it a moment).
                await asyncio.sleep(1.0)
                ran = await http.post(f"/v1/sessions/{sid}/execute",
                                      json={"code": "print('seen elsewhere')"})
                assert ran.status_code == 200, ran.text
                paused = await http.post(f"/v1/sessions/{sid}/pause")
                assert paused.status_code == 200, paused.text
                frames: list[dict[str, Any]] = []
                async with asyncio.timeout(60):
                    while not (frames and frames[-1]["type"] == "transfer"
                               and frames[-1]["state"] != "running"):
                        frames.append(json.loads(await ws.recv()))
        finally:
            await http.delete(f"/v1/sessions/{sid}")
    kinds = [f["type"] for f in frames]
    assert kinds[0] == "execution" and frames[0]["code"] == "print('seen elsewhere')"
    assert {"type": "stdout", "text": "seen elsewhere\n"}.items() <= next(
        f for f in frames if f["type"] == "stdout").items()
    assert "done" in kinds and frames[-1]["operation"] == "pause"
    assert frames[-1]["state"] == "done"
