"""The session WebSocket of a running gateway: streaming, auth, bad input, disconnects."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import websockets
from websockets.asyncio.client import ClientConnection, connect

from tests.conftest import GatewayProcess


def ws_url(gateway: GatewayProcess, sid: str) -> str:
    return gateway.url.replace("http://", "ws://") + f"/v1/sessions/{sid}/ws"


@pytest.fixture(scope="module")
async def sid(gateway: GatewayProcess) -> AsyncIterator[str]:
    async with httpx.AsyncClient(base_url=gateway.url, headers=gateway.headers()) as client:
        answer = await client.post("/v1/sessions", json={})
        assert answer.status_code == 201
        yield answer.json()["id"]
        await client.delete(f"/v1/sessions/{answer.json()['id']}")


def stdout_of(frames: list[dict[str, Any]]) -> str:
    """The stdout text of an execution (the kernel may split a print into several frames)."""
    return "".join(f["text"] for f in frames if f["type"] == "stdout")


async def collect(ws: ClientConnection, execution_id: str) -> list[dict[str, Any]]:
    frames = []
    async with asyncio.timeout(60):
        while True:
            frame = json.loads(await ws.recv())
            if frame.get("execution_id") != execution_id:
                continue
            frame["_at"] = time.monotonic()
            frames.append(frame)
            if frame["type"] in ("done", "rejected"):
                return frames


async def test_ws_streams_events_as_they_happen(gateway: GatewayProcess, sid: str) -> None:
    async with connect(ws_url(gateway, sid), additional_headers=gateway.headers()) as ws:
        sent = time.monotonic()
        code = "import time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('second')\n42"
        await ws.send(json.dumps({"type": "execute", "code": code, "id": "stream-1"}))
        frames = await collect(ws, "stream-1")
    types = [f["type"] for f in frames]
    assert types[0] == "stdout" and frames[0]["text"].startswith("first")
    assert types[-1] == "done" and frames[-1]["status"] == "ok"
    assert "result" in types and frames[types.index("result")]["data"]["text/plain"] == "42"
    assert frames[-1]["_at"] - frames[0]["_at"] > 1.0, "first line was not streamed early"
    assert frames[0]["_at"] - sent < 1.0
    done = frames[-1]
    assert set(done) >= {"status", "execution_count", "truncated", "restarted", "duration_ms"}


async def test_ws_accepts_token_query_for_browsers(gateway: GatewayProcess, sid: str) -> None:
    url = ws_url(gateway, sid) + f"?token={gateway.keys['alpha']}"
    async with connect(url) as ws:
        await ws.send(json.dumps({"type": "execute", "code": "print('q')", "id": "q"}))
        frames = await collect(ws, "q")
    assert stdout_of(frames) == "q\n"


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"}])
async def test_ws_refuses_missing_or_wrong_key(gateway: GatewayProcess, sid: str,
                                               headers: dict[str, str]) -> None:
    try:
        async with connect(ws_url(gateway, sid), additional_headers=headers) as ws:
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await ws.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401
    except websockets.InvalidStatus as exc:
        assert exc.response.status_code in (401, 403)


async def test_ws_refuses_foreign_browser_origin(gateway: GatewayProcess, sid: str) -> None:
    headers = {**gateway.headers(), "Origin": "https://evil.example"}
    async with connect(ws_url(gateway, sid), additional_headers=headers) as ws:
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403


async def test_ws_other_tenant_session_is_not_found(gateway: GatewayProcess, sid: str) -> None:
    async with connect(ws_url(gateway, sid), additional_headers=gateway.headers("beta")) as ws:
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4404


@pytest.mark.parametrize("message", ["not json", "[]", '{"type": "nope"}',
                                     '{"type": "execute"}', '{"type": "execute", "code": 1}',
                                     '{"type": "execute", "code": "1", "timeout_s": -1}'])
async def test_ws_rejects_bad_messages_and_stays_open(gateway: GatewayProcess, sid: str,
                                                      message: str) -> None:
    async with connect(ws_url(gateway, sid), additional_headers=gateway.headers()) as ws:
        await ws.send(message)
        frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert frame["type"] == "rejected" and frame["detail"]
        after = f"after-{uuid.uuid4()}"
        await ws.send(json.dumps({"type": "execute", "code": "print('alive')", "id": after}))
        frames = await collect(ws, after)
    assert stdout_of(frames) == "alive\n"


async def test_ws_rejects_reused_execution_id(gateway: GatewayProcess, sid: str) -> None:
    async with connect(ws_url(gateway, sid), additional_headers=gateway.headers()) as ws:
        await ws.send(json.dumps({"type": "execute", "code": "1", "id": "once"}))
        assert (await collect(ws, "once"))[-1]["type"] == "done"
        await ws.send(json.dumps({"type": "execute", "code": "2", "id": "once"}))
        frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
    assert frame["type"] == "rejected" and frame["status_code"] == 409
    assert "already used" in frame["detail"]


async def test_ws_interrupt_ends_execution_as_interrupted(gateway: GatewayProcess,
                                                          sid: str) -> None:
    async with connect(ws_url(gateway, sid), additional_headers=gateway.headers()) as ws:
        await ws.send(json.dumps({"type": "execute", "code": "import time\nprint('go', flush=True)"
                                  "\ntime.sleep(30)", "id": "int-1"}))
        first = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert first["text"].startswith("go")
        await ws.send(json.dumps({"type": "interrupt"}))
        frames = await collect(ws, "int-1")
    assert frames[-1]["status"] == "interrupted"
    assert frames[-1]["duration_ms"] < 20_000


async def test_ws_disconnect_leaves_execution_running_and_recorded(gateway: GatewayProcess,
                                                                   sid: str) -> None:
    async with connect(ws_url(gateway, sid), additional_headers=gateway.headers()) as ws:
        await ws.send(json.dumps({"type": "execute", "id": "gone-1",
                                  "code": "import time\ntime.sleep(2)\nsurvived = 'yes'\n"
                                          "print('finished')"}))
    async with httpx.AsyncClient(base_url=gateway.url, headers=gateway.headers()) as client:
        async with asyncio.timeout(60):
            while True:
                history = (await client.get(f"/v1/sessions/{sid}/executions")).json()
                record = next((h for h in history if h["id"] == "gone-1"), None)
                if record and record["status"] != "running":
                    break
                await asyncio.sleep(0.2)
        assert record["result"]["stdout"] == "finished\n"
        answer = await client.post(f"/v1/sessions/{sid}/execute", json={"code": "print(survived)"})
        assert answer.json()["stdout"] == "yes\n"


async def test_ws_runs_queued_executions_in_order(gateway: GatewayProcess, sid: str) -> None:
    async with connect(ws_url(gateway, sid), additional_headers=gateway.headers()) as ws:
        for i in range(5):
            await ws.send(json.dumps({"type": "execute", "code": f"print({i})", "id": f"o{i}"}))
        seen = []
        async with asyncio.timeout(60):
            while len(seen) < 5:
                frame = json.loads(await ws.recv())
                if frame["type"] == "stdout" and frame["text"].strip():
                    seen.append(frame["text"].strip())
    assert seen == ["0", "1", "2", "3", "4"]


async def test_ws_done_execution_is_in_history_at_once(gateway: GatewayProcess,
                                                      sid: str) -> None:
    """The history shows an execution finished as soon as its "done" was sent, before the
    database has it (from memory until then)."""
    async with (connect(ws_url(gateway, sid), additional_headers=gateway.headers()) as ws,
                httpx.AsyncClient(base_url=gateway.url, headers=gateway.headers()) as client):
        for n in range(5):
            eid = f"seen-{uuid.uuid4().hex}"
            await ws.send(json.dumps({"type": "execute", "id": eid, "code": f"print({n})"}))
            frames = await collect(ws, eid)
            assert frames[-1]["type"] == "done"
            history = (await client.get(f"/v1/sessions/{sid}/executions")).json()
            assert [h["seq"] for h in history] == sorted(h["seq"] for h in history)
            record = next(h for h in history if h["id"] == eid)
            assert record["status"] == "ok" and record["result"]["stdout"] == f"{n}\n"
            assert record["finished_at"] is not None


async def test_execute_on_a_paused_session_resumes_it(gateway: GatewayProcess, sid: str) -> None:
    async with httpx.AsyncClient(base_url=gateway.url, headers=gateway.headers(),
                                 timeout=120) as client:
        await client.post(f"/v1/sessions/{sid}/execute",
                          json={"code": "ws_kept = 'across a pause'"})
        assert (await client.post(f"/v1/sessions/{sid}/pause")).status_code == 200
    async with connect(ws_url(gateway, sid), additional_headers=gateway.headers()) as ws:
        await ws.send(json.dumps({"type": "execute", "code": "print(ws_kept)", "id": "paused-1"}))
        frames = await collect(ws, "paused-1")

    assert frames[-1]["status"] == "ok"
    assert stdout_of(frames) == "across a pause\n"
