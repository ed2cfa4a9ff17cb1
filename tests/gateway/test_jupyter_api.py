"""The Jupyter-compatible kernel API, end to end, against real Jupyter clients.

A real ``replgate serve`` (the session fixture), real sandboxes, and the Jupyter ecosystem's
own code on the other side: jupyter_client's Session builds the messages, jupyter_server's
framing functions speak the v1 binary subprotocol, a ``jupyter server --gateway-url`` subprocess
proxies to replgate, and nbclient and ``jupyter nbconvert --execute`` run a notebook through
jupyter_server's GatewayKernelManager, unpatched, configured only as Jupyter documents it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import nbformat
import pytest
from jupyter_client.jsonutil import json_default
from jupyter_client.session import Session as JupyterSession
from jupyter_server.services.kernels.connection.base import (
    deserialize_binary_message,
    deserialize_msg_from_ws_v1,
    serialize_binary_message,
    serialize_msg_to_ws_v1,
)
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus
from websockets.typing import Subprotocol

from gateway.jupyter import ChannelPasses
from gateway.jupyter import protocol as jupyter_protocol
from tests.conftest import CLIENT_TIMEOUT_S, REPO, GatewayProcess, free_port

V1 = "v1.kernel.websocket.jupyter.org"
GATEWAY_KERNEL_MANAGER = "jupyter_server.gateway.managers.GatewayKernelManager"
SANDBOX_CHECK = (
    "import os, socket\n"
    "print('uid', os.getuid())\n"
    "try:\n"
    "    socket.create_connection(('1.1.1.1', 53), timeout=3)\n"
    "    print('network: yes')\n"
    "except OSError as exc:\n"
    "    print('network: no', exc.errno)\n"
)


def token_headers(gateway: GatewayProcess, tenant: str = "alpha") -> dict[str, str]:
    """Jupyter's scheme, as jupyter_server's gateway client sends it."""
    return {"Authorization": f"token {gateway.keys[tenant]}"}


@pytest.fixture(scope="module")
def alpha(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, headers=token_headers(gateway), timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def beta(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, headers=token_headers(gateway, "beta"),
                      timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
async def api(gateway: GatewayProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway.url, headers=token_headers(gateway),
                                 timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def kernel_id(alpha: httpx.Client) -> Iterator[str]:
    answer = alpha.post("/api/kernels", json={"name": "python3"})
    assert answer.status_code == 201, answer.text
    yield answer.json()["id"]
    alpha.delete(f"/api/kernels/{answer.json()['id']}")


class Channels:
    """A client of ``/api/kernels/{id}/channels``: jupyter_client builds the messages,
    jupyter_server's functions frame them for the v1 subprotocol."""

    def __init__(self, ws: ClientConnection, binary: bool) -> None:
        self.ws = ws
        self.binary = binary
        self.session = JupyterSession(key=b"", username="test")

    async def send(self, msg_type: str, content: dict[str, Any], channel: str = "shell") -> str:
        msg = self.session.msg(msg_type, content)
        if self.binary:
            await self.ws.send(serialize_msg_to_ws_v1(msg, channel, self.session.pack))
        else:
            await self.ws.send(json.dumps({**msg, "channel": channel}, default=json_default))
        msg_id: str = msg["header"]["msg_id"]
        return msg_id

    async def receive(self, within: float = 60) -> dict[str, Any]:
        frame = await asyncio.wait_for(self.ws.recv(), within)
        if self.binary:
            assert isinstance(frame, bytes)
            channel, parts = deserialize_msg_from_ws_v1(frame)
            header, parent, metadata, content = (json.loads(p) for p in parts[:4])
            return {"channel": channel, "header": header, "parent_header": parent,
                    "metadata": metadata, "content": content, "msg_type": header["msg_type"]}
        assert isinstance(frame, str)
        message: dict[str, Any] = json.loads(frame)
        return message

    async def collect(self, msg_id: str, within: float = 60) -> list[dict[str, Any]]:
        """Every message caused by ``msg_id`` until both its reply and its idle status came."""
        got: list[dict[str, Any]] = []
        replied = idle = False
        deadline = time.monotonic() + within
        while not (replied and idle):
            message = await self.receive(deadline - time.monotonic())
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            got.append(message)
            replied |= message["channel"] in ("shell", "control")
            idle |= (message["msg_type"] == "status"
                     and message["content"]["execution_state"] == "idle")
        return got

    async def execute(self, code: str, **content: Any) -> list[dict[str, Any]]:
        msg_id = await self.send("execute_request", {
            "code": code, "silent": False, "store_history": True, "user_expressions": {},
            "allow_stdin": False, "stop_on_error": True, **content})
        return await self.collect(msg_id)


def ws_url(gateway: GatewayProcess, kernel: str) -> str:
    return f"{gateway.url.replace('http', 'ws', 1)}/api/kernels/{kernel}/channels"


@contextlib.asynccontextmanager
async def channels(gateway: GatewayProcess, kernel: str, binary: bool = False,
                   tenant: str = "alpha") -> AsyncIterator[Channels]:
    async with connect(ws_url(gateway, kernel), additional_headers=token_headers(gateway, tenant),
                       subprotocols=[Subprotocol(V1)] if binary else None,
                       max_size=None) as ws:
        yield Channels(ws, binary)


def of_type(messages: list[dict[str, Any]], msg_type: str) -> list[dict[str, Any]]:
    return [m for m in messages if m["msg_type"] == msg_type]


def stdout(messages: list[dict[str, Any]]) -> str:
    return "".join(m["content"]["text"] for m in of_type(messages, "stream")
                   if m["content"]["name"] == "stdout")


# -- framing -------------------------------------------------------------------------------------


def test_frames_round_trip_with_jupyter_server_framing() -> None:
    session = JupyterSession(key=b"")
    request = session.msg("execute_request", {"code": "1"})
    v1 = jupyter_protocol.decode(serialize_msg_to_ws_v1(request, "control", session.pack), True)
    legacy = jupyter_protocol.decode(
        serialize_binary_message({**request, "channel": "shell", "buffers": [b"x"]}), False)
    assert (v1.channel, legacy.channel) == ("control", "shell")
    assert v1.content == legacy.content == {"code": "1"}
    assert v1.msg_id == legacy.msg_id == request["header"]["msg_id"] and not legacy.buffers
    reply = jupyter_protocol.new_message("comm_msg", {"x": 1}, channel="iopub",
                                         parent=v1.header, session="s", buffers=[b"\x00"])
    channel, parts = deserialize_msg_from_ws_v1(jupyter_protocol.encode(reply, True))
    assert channel == "iopub" and json.loads(parts[1])["msg_id"] == v1.msg_id
    assert parts[4] == b"\x00"
    assert deserialize_binary_message(jupyter_protocol.encode(reply, False))["buffers"] == [b"\x00"]


@pytest.mark.parametrize("frame", [b"", b"\xff" * 8, (6).to_bytes(8, "little") * 7,
                                   (6).to_bytes(8, "little") + (99).to_bytes(8, "little") * 6])
def test_decode_refuses_malformed_v1_frames(frame: bytes) -> None:
    with pytest.raises(jupyter_protocol.ProtocolError):
        jupyter_protocol.decode(frame, True)


def test_kernel_reply_is_rebuilt_and_bounded() -> None:
    parent = {"msg_id": "p", "msg_type": "inspect_request"}
    huge = {"status": "ok", "data": {"text/plain": "x" * (9 * 1024 * 1024)}}
    msg = {"header": {"msg_type": "inspect_reply", "msg_id": "k"}, "content": huge,
           "metadata": {"m": object()}, "buffers": [b"x" * (2 * 1024 * 1024)]}
    rebuilt = jupyter_protocol.from_kernel(msg, channel="shell", parent=parent, session="s")
    assert rebuilt.msg_type == "inspect_reply" and rebuilt.msg_id != "k"
    assert rebuilt.parent_header == parent
    assert rebuilt.content["status"] == "error" and rebuilt.content["ename"] == "ReplyTooLarge"
    assert rebuilt.buffers == [] and rebuilt.metadata == {"m": str(msg["metadata"]["m"])}


# -- REST ----------------------------------------------------------------------------------------


def test_kernelspecs_list_profiles_with_python3_default(alpha: httpx.Client) -> None:
    assert alpha.get("/api").json()["version"]
    specs = alpha.get("/api/kernelspecs").json()
    assert specs["default"] == "python3"
    python3 = specs["kernelspecs"]["python3"]
    assert python3["name"] == "python3" and python3["resources"] == {}
    assert set(python3["spec"]) >= {"argv", "display_name", "language", "interrupt_mode",
                                    "metadata", "env"}
    assert python3["spec"]["language"] == "python"
    assert alpha.get("/api/kernelspecs/python3").json() == python3


def test_kernelspec_unknown_is_404(alpha: httpx.Client) -> None:
    assert alpha.get("/api/kernelspecs/nope").status_code == 404
    answer = alpha.post("/api/kernels", json={"name": "nope"})
    assert answer.status_code == 404
    assert "nope" in answer.json()["message"]


@pytest.mark.parametrize("headers", [{}, {"Authorization": "token wrong"},
                                     {"Authorization": "Basic abc"}])
@pytest.mark.parametrize("path", ["/api", "/api/kernelspecs", "/api/kernels"])
def test_api_refuses_missing_or_wrong_token(gateway: GatewayProcess, headers: dict[str, str],
                                            path: str) -> None:
    answer = httpx.get(f"{gateway.url}{path}", headers=headers)
    assert answer.status_code == 401
    assert "detail" in answer.json()


def test_api_accepts_bearer_and_query_token(gateway: GatewayProcess) -> None:
    key = gateway.keys["alpha"]
    assert httpx.get(f"{gateway.url}/api/kernels",
                     headers={"Authorization": f"Bearer {key}"}).status_code == 200
    assert httpx.get(f"{gateway.url}/api/kernels", params={"token": key}).status_code == 200


def test_kernel_lifecycle_matches_kernel_gateway(alpha: httpx.Client) -> None:
    answer = alpha.post("/api/kernels", json={"name": "python3", "env": {"KERNEL_GREETING": "hi"}})
    assert answer.status_code == 201, answer.text
    model = answer.json()
    kid = model["id"]
    assert set(model) == {"id", "name", "last_activity", "execution_state", "connections"}
    assert str(uuid.UUID(kid)) == kid  # jupyter_server routes only dashed UUIDs
    assert answer.headers["location"] == f"/api/kernels/{kid}"
    assert model["name"] == "python3" and model["connections"] == 0
    time.strptime(model["last_activity"], "%Y-%m-%dT%H:%M:%S.%fZ")  # the gateway client's format
    assert alpha.get(f"/api/kernels/{kid}").json()["id"] == kid
    assert kid in [k["id"] for k in alpha.get("/api/kernels").json()]
    session = alpha.get(f"/v1/sessions/{kid}").json()
    assert session["tenant"] == "alpha" and session["profile"] == "default"
    result = alpha.post(f"/v1/sessions/{kid}/execute",
                        json={"code": "import os; print(os.environ['KERNEL_GREETING'])"})
    assert result.json()["stdout"] == "hi\n"
    assert alpha.post(f"/api/kernels/{kid}/interrupt").status_code == 204
    restarted = alpha.post(f"/api/kernels/{kid}/restart")
    assert restarted.status_code == 200 and restarted.json()["id"] == kid
    assert alpha.delete(f"/api/kernels/{kid}").status_code == 204
    assert alpha.get(f"/api/kernels/{kid}").status_code == 404
    assert kid not in [s["id"] for s in alpha.get("/v1/sessions").json()]


def test_session_from_v1_api_is_a_kernel(alpha: httpx.Client) -> None:
    sid = alpha.post("/v1/sessions", json={}).json()["id"]
    try:
        assert sid in [k["id"] for k in alpha.get("/api/kernels").json()]
        assert alpha.get(f"/api/kernels/{sid}").json()["name"] == "python3"
    finally:
        alpha.delete(f"/v1/sessions/{sid}")


def test_other_tenant_sees_kernel_as_missing(beta: httpx.Client, kernel_id: str) -> None:
    for method, path in [("GET", ""), ("DELETE", ""), ("POST", "/interrupt"),
                         ("POST", "/restart")]:
        answer = beta.request(method, f"/api/kernels/{kernel_id}{path}")
        assert answer.status_code == 404, (method, path, answer.text)
    assert kernel_id not in [k["id"] for k in beta.get("/api/kernels").json()]


# -- channels ------------------------------------------------------------------------------------


async def refused_status(url: str, **options: Any) -> int:
    with pytest.raises(InvalidStatus) as refused:
        async with connect(url, **options):
            pass
    status: int = refused.value.response.status_code
    return status


async def test_channels_refuse_wrong_token_or_other_tenant(gateway: GatewayProcess,
                                                           kernel_id: str) -> None:
    wrong = {"Authorization": "token wrong"}
    assert await refused_status(ws_url(gateway, kernel_id), additional_headers=wrong) == 401
    with pytest.raises(InvalidStatus) as missing:
        async with channels(gateway, kernel_id, tenant="beta"):
            pass
    assert missing.value.response.status_code == 404


def test_channel_pass_is_single_use_for_its_address_and_expires() -> None:
    now = [0.0]
    passes = ChannelPasses(ttl_s=60, limit=2, clock=lambda: now[0])
    passes.grant("k1", "alpha", "10.0.0.1")
    assert passes.take("k1", "10.0.0.2") is None  # another address: refused, the pass stays
    assert passes.take("k1", "10.0.0.1") == "alpha"
    assert passes.take("k1", "10.0.0.1") is None  # used up
    passes.grant("k2", "alpha", "10.0.0.1")
    now[0] = 60.0
    assert passes.take("k2", "10.0.0.1") is None  # expired
    for kernel in ("k3", "k4", "k5"):
        passes.grant(kernel, "beta", "10.0.0.1")
    assert passes.take("k3", "10.0.0.1") is None  # the oldest dropped past the limit
    assert passes.take("k5", "10.0.0.1") == "beta"


async def test_channels_without_a_key_need_their_clients_pass(gateway: GatewayProcess,
                                                              api: httpx.AsyncClient) -> None:
    """jupyter_server's GatewayKernelClient opens the channels with no key: it is let in once
    after its own authenticated request for the kernel, from that address; never on the kernel
    id alone, another tenant's request, or another address's."""
    answer = await api.post("/v1/sessions", json={})  # not a Jupyter request: no pass
    assert answer.status_code == 201, answer.text
    kid = answer.json()["id"]
    url = ws_url(gateway, kid)
    other = {"local_addr": ("127.0.0.2", 0)}  # another client address (loopback: any 127/8)
    try:
        assert await refused_status(url) == 401  # the kernel id alone
        async with httpx.AsyncClient(base_url=gateway.url,
                                     headers=token_headers(gateway, "beta")) as beta:
            assert (await beta.get(f"/api/kernels/{kid}")).status_code == 404
        assert await refused_status(url) == 401  # another tenant's request leaves no pass
        async with httpx.AsyncClient(base_url=gateway.url, headers=token_headers(gateway),
                                     transport=httpx.AsyncHTTPTransport(
                                         local_address="127.0.0.2")) as elsewhere:
            assert (await elsewhere.get(f"/api/kernels/{kid}")).status_code == 200
        assert await refused_status(url) == 401  # the pass is 127.0.0.2's
        async with connect(url, **other) as ws:
            messages = await Channels(ws, binary=False).execute(
                "import os; print(os.getuid(), os.getcwd())")
        assert stdout(messages) == "1000 /home/user\n"
        assert await refused_status(url, **other) == 401  # used up
    finally:
        await api.delete(f"/v1/sessions/{kid}")


async def test_execute_over_json_streams_jupyter_messages(gateway: GatewayProcess,
                                                          api: httpx.AsyncClient,
                                                          kernel_id: str) -> None:
    async with channels(gateway, kernel_id) as ch:
        messages = await ch.execute("print('hello')\n6 * 7")
        assert (await api.get(f"/api/kernels/{kernel_id}")).json()["connections"] == 1
    kinds = [(m["channel"], m["msg_type"]) for m in messages]
    assert kinds[:2] == [("iopub", "status"), ("iopub", "execute_input")]
    assert ("iopub", "stream") in kinds and ("iopub", "execute_result") in kinds
    assert kinds[-1] == ("iopub", "status") and messages[-1]["content"]["execution_state"] == "idle"
    assert stdout(messages) == "hello\n"
    (result,) = of_type(messages, "execute_result")
    assert result["content"]["data"] == {"text/plain": "42"}
    (reply,) = of_type(messages, "execute_reply")
    assert reply["content"]["status"] == "ok"
    assert reply["content"]["execution_count"] == result["content"]["execution_count"]
    for message in messages:
        assert message["header"]["version"] == "5.3" and message["header"]["session"]
        assert message["header"]["msg_id"] != message["parent_header"]["msg_id"]
    assert len({m["header"]["msg_id"] for m in messages}) == len(messages)
    history = (await api.get(f"/v1/sessions/{kernel_id}/executions")).json()
    assert history[-1]["code"] == "print('hello')\n6 * 7" and history[-1]["status"] == "ok"
    notebook = (await api.get(f"/v1/sessions/{kernel_id}/notebook")).json()
    assert notebook["cells"][-1]["outputs"][0]["text"] == "hello\n"


async def test_execute_over_v1_subprotocol_speaks_binary(gateway: GatewayProcess,
                                                         kernel_id: str) -> None:
    async with channels(gateway, kernel_id, binary=True) as ch:
        assert ch.ws.subprotocol == V1
        messages = await ch.execute("import sys\nprint('out'); print('err', file=sys.stderr)")
    streams = {m["content"]["name"]: m["content"]["text"] for m in of_type(messages, "stream")}
    assert streams == {"stdout": "out\n", "stderr": "err\n"}
    assert {m["channel"] for m in messages} == {"iopub", "shell"}
    assert of_type(messages, "execute_reply")[0]["content"]["status"] == "ok"


def held_until_released(marker: str, then: str) -> str:
    """A cell that runs ``then`` once the file ``marker`` is in the workspace (a TimeoutError
    if it never comes)."""
    return (f"import os, time\n"
            f"deadline = time.monotonic() + 60\n"
            f"while not os.path.exists({f'/home/user/{marker}'!r}):\n"
            f"    if time.monotonic() > deadline:\n"
            f"        raise TimeoutError('never released')\n"
            f"    time.sleep(0.01)\n"
            f"{then}\n")


async def release(gateway: GatewayProcess, api: httpx.AsyncClient, kernel_id: str,
                  marker: str) -> None:
    answer = await api.put(f"/v1/sessions/{kernel_id}/files/{marker}", content=b"",
                           headers={"Authorization": f"Bearer {gateway.keys['alpha']}"})
    assert answer.status_code == 201, answer.text


async def test_execute_error_aborts_queued_requests(gateway: GatewayProcess,
                                                    api: httpx.AsyncClient,
                                                    kernel_id: str) -> None:
    """The queued cell reached the gateway before the error (see the next test for why the
    failing cell waits for that)."""
    marker = f"release-{uuid.uuid4().hex}"
    async with channels(gateway, kernel_id) as ch:
        failing = await ch.send("execute_request", {
            "code": held_until_released(marker, "1/0"), "stop_on_error": True})
        queued = await ch.send("execute_request", {"code": "print('never')"})
        await ch.collect(await ch.send("kernel_info_request", {}))
        await release(gateway, api, kernel_id, marker)
        failed, aborted = await ch.collect(failing), await ch.collect(queued)
        after = await ch.execute("print('runs again')")
    (error,) = of_type(failed, "error")
    assert error["content"]["ename"] == "ZeroDivisionError"
    reply = of_type(failed, "execute_reply")[0]["content"]
    assert reply["status"] == "error" and reply["ename"] == "ZeroDivisionError"
    assert of_type(aborted, "execute_reply")[0]["content"]["status"] == "aborted"
    assert not of_type(aborted, "stream")
    assert stdout(after) == "runs again\n"


def autogen_execute(code: str) -> tuple[str, str]:
    """An execute_request framed byte for byte as AutoGen's ``JupyterKernelClient`` frames it
    (autogen-ext 0.7.5, ``code_executors/docker_jupyter/_jupyter_server.py``); its msg_id."""
    msg_id = uuid.uuid4().hex
    return msg_id, json.dumps({
        "header": {"username": "autogen", "version": "5.0", "session": "autogen-session",
                   "msg_id": msg_id, "msg_type": "execute_request",
                   "date": datetime.datetime.now().isoformat()},
        "parent_header": {}, "channel": "shell",
        "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True},
        "metadata": {}, "buffers": {}})


async def test_a_cell_sent_once_the_error_is_seen_runs(gateway: GatewayProcess,
                                                       api: httpx.AsyncClient,
                                                       kernel_id: str) -> None:
    """AutoGen's DockerJupyterCodeExecutor (autogen-ext, not installed here: its autogen-core
    pins protobuf 5 where the lock has 7) returns on a cell's ``error`` message and sends its
    next cell at once, reading no execute_reply; replgate answered that cell ``aborted`` 9 times
    in 10, so the agent read an empty success. Its pattern, repeated: a cell that reached the
    gateway before the error was written is still aborted, as a Jupyter kernel aborts what
    reached it before its error reply, and the one sent after the error was seen runs.

    Sending two frames back to back does not make the second reach the gateway before the first
    one's error: a client descheduled between its two sends (2 loaded cores) sends it after,
    and then neither ipykernel (``stop_on_error_timeout`` 0) nor the gateway can tell it from a
    reaction to the error. So the failing cell waits until a ``kernel_info_request`` sent after
    the queued cell is answered (the gateway reads a connection's frames in order) and the
    test then releases it."""
    async with channels(gateway, kernel_id) as ch:
        for attempt in range(20):
            marker = f"release-{uuid.uuid4().hex}"
            failing, frame = autogen_execute(
                held_until_released(marker, f"raise ValueError('{attempt}')"))
            queued, queued_frame = autogen_execute("print('never')")
            await ch.ws.send(frame)
            await ch.ws.send(queued_frame)
            info = await ch.send("kernel_info_request", {})
            seen: dict[str, list[dict[str, Any]]] = {failing: [], queued: [], info: []}
            while not of_type(seen[info], "kernel_info_reply"):
                message = await ch.receive()
                seen.setdefault(message["parent_header"].get("msg_id"), []).append(message)
            assert not of_type(seen[failing], "error"), f"attempt {attempt}: not held"
            await release(gateway, api, kernel_id, marker)
            while not of_type(seen[failing], "error"):
                message = await ch.receive()
                seen.setdefault(message["parent_header"].get("msg_id"), []).append(message)
            after, after_frame = autogen_execute(f"print('ran', {attempt})")
            await ch.ws.send(after_frame)
            seen[after] = []
            while not of_type(seen[after], "execute_reply") or not any(
                    m["content"].get("execution_state") == "idle"
                    for m in of_type(seen[after], "status")):
                message = await ch.receive()
                seen.setdefault(message["parent_header"].get("msg_id"), []).append(message)
            assert of_type(seen[failing], "error")[0]["content"]["evalue"] == str(attempt)
            assert [m["content"]["status"] for m in of_type(seen[queued], "execute_reply")] == [
                "aborted"], f"attempt {attempt}"
            assert of_type(seen[after], "execute_reply")[0]["content"]["status"] == "ok", (
                f"attempt {attempt}: the cell sent once the error was seen did not run")
            assert stdout(seen[after]) == f"ran {attempt}\n"


async def test_kernel_requests_are_relayed(gateway: GatewayProcess, kernel_id: str) -> None:
    async with channels(gateway, kernel_id) as ch:
        info = await ch.collect(await ch.send("kernel_info_request", {}))
        await ch.execute("replgate_variable = 1")
        inspection = await ch.collect(await ch.send("inspect_request", {
            "code": "replgate_variable", "cursor_pos": 17, "detail_level": 0}))
        complete = await ch.collect(await ch.send("is_complete_request", {"code": "for x in y:"}))
    reply = of_type(info, "kernel_info_reply")[0]
    assert reply["channel"] == "shell" and reply["content"]["language_info"]["name"] == "python"
    assert reply["content"]["debugger"] is False
    assert [m["content"]["execution_state"] for m in of_type(info, "status")] == ["busy", "idle"]
    found = of_type(inspection, "inspect_reply")[0]["content"]
    assert found["status"] == "ok" and found["found"] is True
    assert "int" in found["data"]["text/plain"]
    assert of_type(complete, "is_complete_reply")[0]["content"]["status"] == "incomplete"


async def test_interrupt_stops_running_code(gateway: GatewayProcess, api: httpx.AsyncClient,
                                            kernel_id: str) -> None:
    async with channels(gateway, kernel_id) as ch:
        for via_rest in (True, False):
            started = time.monotonic()
            msg_id = await ch.send("execute_request", {"code": "import time; time.sleep(30)"})
            await asyncio.sleep(1.0)
            if via_rest:
                answer = await api.post(f"/api/kernels/{kernel_id}/interrupt")
                assert answer.status_code == 204
            else:
                await ch.send("interrupt_request", {}, channel="control")
            messages = await ch.collect(msg_id)
            reply = of_type(messages, "execute_reply")[0]["content"]
            assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
            assert time.monotonic() - started < 15


async def test_input_fails_fast_and_bad_frames_are_dropped(gateway: GatewayProcess,
                                                           kernel_id: str) -> None:
    async with channels(gateway, kernel_id) as ch:
        await ch.ws.send("not json")
        await ch.ws.send(json.dumps({"channel": "shell", "header": {"msg_type": 3}}))
        await ch.ws.send(b"\x00\x01")
        started = time.monotonic()
        messages = await ch.execute("input('name? ')", allow_stdin=True)
    assert of_type(messages, "execute_reply")[0]["content"]["status"] == "error"
    assert time.monotonic() - started < 10


async def test_kernel_death_is_an_error_and_kernel_recovers(gateway: GatewayProcess,
                                                            api: httpx.AsyncClient) -> None:
    kid = (await api.post("/api/kernels", json={})).json()["id"]
    try:
        async with channels(gateway, kid) as ch:
            died = await ch.execute("import os; os._exit(1)")
            after = await ch.execute("print('back')")
        reply = of_type(died, "execute_reply")[0]["content"]
        assert reply["status"] == "error" and reply["ename"] == "DeadKernelError"
        assert of_type(died, "error")[0]["content"]["evalue"]
        assert stdout(after) == "back\n"
    finally:
        await api.delete(f"/api/kernels/{kid}")


async def test_deleting_kernel_closes_its_channels(gateway: GatewayProcess,
                                                   api: httpx.AsyncClient) -> None:
    kid = (await api.post("/api/kernels", json={})).json()["id"]
    async with channels(gateway, kid) as ch:
        assert (await api.delete(f"/api/kernels/{kid}")).status_code == 204
        last = await ch.receive(within=30)
        assert last["msg_type"] == "status" and last["content"]["execution_state"] == "dead"
        await asyncio.wait_for(ch.ws.wait_closed(), 10)


# -- real Jupyter clients --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jupyter_server(gateway: GatewayProcess) -> Iterator[tuple[str, str]]:
    """``jupyter server --gateway-url=<replgate>`` with tenant alpha's key: (url, its token)."""
    root = Path(tempfile.mkdtemp(prefix="rg-js-"))
    port, token = free_port(), uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "KERNEL_"))}
    env.update({"JUPYTER_GATEWAY_AUTH_TOKEN": gateway.keys["alpha"],
                "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
                "JUPYTER_DATA_DIR": str(root / "data"), "JUPYTER_CONFIG_DIR": str(root / "config")})
    log = open(root / "server.log", "wb")  # noqa: SIM115 - owned by the process's lifetime
    process = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", f"--gateway-url={gateway.url}",
         f"--IdentityProvider.token={token}", f"--port={port}", "--ip=127.0.0.1",
         "--no-browser", "--allow-root", f"--ServerApp.root_dir={root}",
         f"--GatewayClient.request_timeout={CLIENT_TIMEOUT_S}"],  # see gateway_client below
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, (root / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (root / "server.log").read_text()[-3000:]
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/api/status", params={"token": token}).status_code == 200:
                    break
            time.sleep(0.2)
        yield url, token
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        log.close()


async def test_jupyter_server_runs_code_in_the_sandbox(gateway: GatewayProcess,
                                                       api: httpx.AsyncClient,
                                                       jupyter_server: tuple[str, str]) -> None:
    url, token = jupyter_server
    headers = {"Authorization": f"token {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=160) as server:
        assert (await server.get("/api/kernelspecs")).json()["default"] == "python3"
        answer = await server.post("/api/kernels", json={"name": "python3"})
        assert answer.status_code == 201, answer.text
        kid = answer.json()["id"]
        try:
            assert kid in [s["id"] for s in (await api.get("/v1/sessions")).json()]
            socket_url = (f"{url.replace('http', 'ws', 1)}/api/kernels/{kid}/channels"
                          f"?session_id={uuid.uuid4().hex}")
            async with connect(socket_url, additional_headers=headers) as ws:
                messages = await Channels(ws, binary=False).execute(SANDBOX_CHECK)
        finally:
            assert (await server.delete(f"/api/kernels/{kid}")).status_code == 204
    lines = dict(line.split(" ", 1) for line in stdout(messages).splitlines())
    assert int(lines["uid"]) != 0
    assert lines["network:"].startswith("no"), lines
    assert of_type(messages, "execute_reply")[0]["content"]["status"] == "ok"
    assert kid not in [s["id"] for s in (await api.get("/v1/sessions")).json()]


NOTEBOOK = nbformat.v4.new_notebook(
    metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    cells=[nbformat.v4.new_code_cell("import os\nanswer = 6 * 7\nprint(os.getuid(), os.getcwd())"),
           nbformat.v4.new_code_cell("answer"),
           nbformat.v4.new_code_cell("from IPython.display import HTML\nHTML('<b>bold</b>')")])
RUN_NOTEBOOK = """
import sys
import nbformat
from nbclient import NotebookClient
from jupyter_server.gateway.managers import GatewayKernelManager

nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, kernel_manager_class=GatewayKernelManager, timeout=60).execute()
nbformat.write(nb, sys.argv[2])
"""
"""nbclient as Jupyter documents it for a gateway (the README's example)."""


def jupyter_gateway_env(gateway: GatewayProcess, folder: Path) -> dict[str, str]:
    """The environment Jupyter documents for a gateway, and nothing else of Jupyter's: the
    GatewayClient singleton of a new process reads it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "KERNEL_"))}
    env.update({"JUPYTER_GATEWAY_URL": gateway.url,
                "JUPYTER_GATEWAY_AUTH_TOKEN": gateway.keys["alpha"],
                # A kernel start's margin on a loaded machine (CLIENT_TIMEOUT_S), not needed
                # otherwise; also one of Jupyter's documented variables.
                "JUPYTER_GATEWAY_REQUEST_TIMEOUT": str(CLIENT_TIMEOUT_S),
                "JUPYTER_RUNTIME_DIR": str(folder / "runtime"),
                "JUPYTER_DATA_DIR": str(folder / "data"),
                "JUPYTER_CONFIG_DIR": str(folder / "config")})
    return env


def assert_ran_in_the_sandbox(path: Path) -> None:
    first, second, third = nbformat.read(path, as_version=4).cells
    assert os.getcwd() != "/home/user"  # the test's own process: the outputs below are not its
    assert first.outputs[0]["text"] == "1000 /home/user\n"  # the sandbox's user and folder
    assert second.outputs[0]["data"]["text/plain"] == "42"
    assert second.execution_count == 2
    assert third.outputs[0]["data"]["text/html"] == "<b>bold</b>"


def run_jupyter(command: list[str], env: dict[str, str], cwd: Path) -> None:
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=2 * CLIENT_TIMEOUT_S)
    assert done.returncode == 0, f"{command}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def test_nbclient_runs_notebook_on_gateway_configured_by_environment(
        gateway: GatewayProcess, alpha: httpx.Client, tmp_path: Path) -> None:
    """nbclient with jupyter_server's GatewayKernelManager, unpatched, configured only by
    JUPYTER_GATEWAY_URL and JUPYTER_GATEWAY_AUTH_TOKEN (papermill runs the same way)."""
    nbformat.write(NOTEBOOK, tmp_path / "in.ipynb")
    before = {k["id"] for k in alpha.get("/api/kernels").json()}
    run_jupyter([sys.executable, "-c", RUN_NOTEBOOK, "in.ipynb", "out.ipynb"],
                jupyter_gateway_env(gateway, tmp_path), tmp_path)
    assert_ran_in_the_sandbox(tmp_path / "out.ipynb")
    assert {k["id"] for k in alpha.get("/api/kernels").json()} == before  # nbclient deleted it


def test_nbconvert_execute_runs_notebook_on_gateway(gateway: GatewayProcess,
                                                    tmp_path: Path) -> None:
    """The command line: ``jupyter nbconvert --execute`` takes the kernel manager as config."""
    nbformat.write(NOTEBOOK, tmp_path / "in.ipynb")
    jupyter = str(Path(sys.executable).with_name("jupyter"))
    run_jupyter([jupyter, "nbconvert", "--to", "notebook", "--execute",
                 f"--ExecutePreprocessor.kernel_manager_class={GATEWAY_KERNEL_MANAGER}",
                 "--output", "out.ipynb", "in.ipynb"],
                jupyter_gateway_env(gateway, tmp_path), tmp_path)
    assert_ran_in_the_sandbox(tmp_path / "out.ipynb")


def test_jupyter_execute_ignores_kernel_manager_class(tmp_path: Path) -> None:
    """Why the README says nbconvert: ``jupyter execute`` (nbclient's NbClientApp) gives its
    NotebookClient no config, so a kernel manager set on the command line is dropped and a
    local kernel runs. When this fails, nbclient passes it on: say so in the README."""
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import os; os.getcwd()")])
    nbformat.write(notebook, tmp_path / "in.ipynb")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "KERNEL_"))}
    env["JUPYTER_GATEWAY_URL"] = "http://127.0.0.1:9"  # nothing listens: a gateway would fail
    jupyter = str(Path(sys.executable).with_name("jupyter"))
    run_jupyter([jupyter, "execute",
                 f"--NotebookClient.kernel_manager_class={GATEWAY_KERNEL_MANAGER}",
                 "--output=out.ipynb", "in.ipynb"], env, tmp_path)
    cell = nbformat.read(tmp_path / "out.ipynb", as_version=4).cells[0]
    assert cell.outputs[0]["data"]["text/plain"] == repr(str(tmp_path))  # the local kernel's


def test_papermill_command_line_runs_a_local_kernel(tmp_path: Path) -> None:
    """Why docs/api.md shows papermill's Python form: its command line has no option naming a
    kernel manager and reads no Jupyter configuration, so with a gateway configured a local
    kernel runs all the same, silently. When this fails, papermill's command line reaches a
    gateway: say so in the docs."""
    notebook = nbformat.v4.new_notebook(
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}},
        cells=[nbformat.v4.new_code_cell("import os; os.getcwd()")])
    nbformat.write(notebook, tmp_path / "in.ipynb")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "KERNEL_"))}
    env["JUPYTER_GATEWAY_URL"] = "http://127.0.0.1:9"  # nothing listens: a gateway would fail
    papermill = str(Path(sys.executable).with_name("papermill"))
    run_jupyter([papermill, "--no-progress-bar", "in.ipynb", "out.ipynb"], env, tmp_path)
    cell = nbformat.read(tmp_path / "out.ipynb", as_version=4).cells[0]
    assert cell.outputs[0]["data"]["text/plain"] == repr(str(tmp_path))  # the local kernel's


# -- kernels of other languages ----------------------------------------------------------------

BASH_NOTEBOOK = nbformat.v4.new_notebook(
    metadata={"kernelspec": {"name": "bash", "display_name": "Bash", "language": "bash"}},
    cells=[nbformat.v4.new_code_cell("answer=$((6 * 7))\ncd /tmp"),
           nbformat.v4.new_code_cell('echo "$answer in $(pwd) as $(id -u)"')])


def test_kernelspecs_list_each_language_of_the_image(alpha: httpx.Client) -> None:
    specs = alpha.get("/api/kernelspecs").json()["kernelspecs"]
    assert set(specs) == {"python3", "bash", "ir", "deno", "java"}  # the default image's
    bash = specs["bash"]
    assert bash["name"] == "bash" and bash["resources"] == {}
    assert bash["spec"]["language"] == "bash" and bash["spec"]["metadata"]["replgate"][
        "language"] == "bash"
    assert set(bash["spec"]) == set(specs["python3"]["spec"])
    assert alpha.get("/api/kernelspecs/bash").json() == bash
    assert alpha.post("/api/kernels", json={"name": "julia"}).status_code == 404


async def test_a_bash_kernel_runs_bash_over_its_channels(gateway: GatewayProcess,
                                                         api: httpx.AsyncClient) -> None:
    answer = await api.post("/api/kernels", json={"name": "bash"})
    assert answer.status_code == 201, answer.text
    kid = answer.json()["id"]
    try:
        assert answer.json()["name"] == "bash"
        async with channels(gateway, kid) as ch:
            info_id = await ch.send("kernel_info_request", {})
            info = of_type(await ch.collect(info_id), "kernel_info_reply")[0]["content"]
            first = await ch.execute("n=5; echo $((n * 2))")
            failed = await ch.execute("ls /nowhere")
            assert (await api.post(f"/api/kernels/{kid}/restart")).status_code == 200
            after = await ch.execute("echo ${n:-gone}")
        assert info["language_info"]["name"] == "bash" and info["status"] == "ok"
        assert stdout(first) == "10\n"
        assert of_type(first, "execute_reply")[0]["content"]["status"] == "ok"
        assert of_type(failed, "execute_reply")[0]["content"]["status"] == "error"
        assert stdout(after) == "gone\n"  # the restart gave bash a fresh shell
        history = (await api.get(f"/v1/sessions/{kid}/executions")).json()
        assert history[0]["result"]["language"] == "bash"
    finally:
        assert (await api.delete(f"/api/kernels/{kid}")).status_code == 204


RUN_NAMED_NOTEBOOK = RUN_NOTEBOOK.replace(
    "timeout=60).execute()",
    "timeout=60).execute(kernel_name=nb.metadata.kernelspec.name)")
"""nbclient naming the notebook's kernelspec to the kernel manager: GatewayKernelManager's
start_kernel reads the name from its arguments alone (python3 otherwise), which nbclient
passes only when told (jupyter_server's own kernel manager passes it)."""


def test_nbclient_runs_a_bash_notebook_on_the_gateway(gateway: GatewayProcess,
                                                      tmp_path: Path) -> None:
    """nbclient through jupyter_server's GatewayKernelManager, the notebook's kernelspec
    ``bash``: its cells run in the sandbox's bash, one shell for the whole notebook."""
    assert RUN_NAMED_NOTEBOOK != RUN_NOTEBOOK
    nbformat.write(BASH_NOTEBOOK, tmp_path / "in.ipynb")
    run_jupyter([sys.executable, "-c", RUN_NAMED_NOTEBOOK, "in.ipynb", "out.ipynb"],
                jupyter_gateway_env(gateway, tmp_path), tmp_path)
    ran = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    assert ran.cells[1].outputs[0]["text"] == "42 in /tmp as 1000\n"
    assert ran.metadata["language_info"]["name"] == "bash"
