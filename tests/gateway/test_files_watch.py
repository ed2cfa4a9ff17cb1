"""The folder watch WebSocket of a running gateway: frames in order, auth, refusals, and the
last ``end`` frame when the session pauses."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.conftest import GatewayProcess


def watch_url(gateway: GatewayProcess, sid: str, query: str = "") -> str:
    return gateway.url.replace("http://", "ws://") + f"/v1/sessions/{sid}/files/watch{query}"


@pytest.fixture
async def sid(gateway: GatewayProcess) -> AsyncIterator[str]:
    async with httpx.AsyncClient(base_url=gateway.url, headers=gateway.headers(),
                                 timeout=60) as client:
        answer = await client.post("/v1/sessions", json={})
        assert answer.status_code == 201
        yield answer.json()["id"]
        await client.delete(f"/v1/sessions/{answer.json()['id']}")


async def frames_until(ws: ClientConnection, last: str, timeout_s: float = 30
                       ) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout_s):
        while not frames or frames[-1]["type"] != last:
            frames.append(json.loads(await ws.recv()))
    return frames


async def test_changes_are_sent_in_order_with_workspace_paths(gateway: GatewayProcess,
                                                              sid: str) -> None:
    async with (httpx.AsyncClient(base_url=gateway.url, headers=gateway.headers(),
                                  timeout=60) as client,
                connect(watch_url(gateway, sid, "?token=" + gateway.keys["alpha"])) as ws):
        assert json.loads(await ws.recv()) == {"type": "ready"}
        put = await client.put(f"/v1/sessions/{sid}/files/notes/a.txt", content=b"hi")
        assert put.status_code == 201
        ran = await client.post(f"/v1/sessions/{sid}/commands",
                                json={"cmd": "mv notes/a.txt notes/b.txt && rm -r notes"})
        assert ran.status_code == 200, ran.text
        frames = await frames_until(ws, "remove")
        while frames[-1] != {"type": "remove", "path": "notes", "is_dir": True}:
            frames += await frames_until(ws, "remove")

    # (a.txt's chmod, the gateway giving it to the sandbox's user, is seen only when the
    # watch on the new folder was in place before the file was made in it)
    assert [(f["type"], f["path"], f["is_dir"]) for f in frames if f["type"] != "chmod"] == [
        ("create", "notes", True), ("create", "notes/a.txt", False),
        ("write", "notes/a.txt", False), ("rename", "notes/a.txt", False),
        ("create", "notes/b.txt", False), ("remove", "notes/b.txt", False),
        ("remove", "notes", True)]


async def test_a_pause_sends_the_end_frame_then_closes(gateway: GatewayProcess,
                                                        sid: str) -> None:
    async with (httpx.AsyncClient(base_url=gateway.url, headers=gateway.headers(),
                                  timeout=60) as client,
                connect(watch_url(gateway, sid, "?path=&recursive=false"),
                        additional_headers=gateway.headers()) as ws):
        assert json.loads(await ws.recv()) == {"type": "ready"}
        assert (await client.post(f"/v1/sessions/{sid}/pause")).status_code == 200
        frames = await frames_until(ws, "end")
        assert frames[-1] == {"type": "end", "reason": "the session was paused"}
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000


@pytest.mark.parametrize(("query", "code", "reason"), [
    ("?path=nope", 4404, "nope"),
    ("?path=../etc", 4400, "leaves the session's workspace"),
])
async def test_a_refused_watch_closes_with_the_errors_code(
        gateway: GatewayProcess, sid: str, query: str, code: int, reason: str) -> None:
    async with connect(watch_url(gateway, sid, query),
                       additional_headers=gateway.headers()) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == code and reason in closed.value.rcvd.reason


async def test_a_watch_needs_the_key_and_the_tenants_session(gateway: GatewayProcess,
                                                             sid: str) -> None:
    async with connect(watch_url(gateway, sid)) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401
    async with connect(watch_url(gateway, "no-such-session"),
                       additional_headers=gateway.headers()) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4404
