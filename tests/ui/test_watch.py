"""The watch WebSocket: history first, then every execution of the session live, bounded."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from gateway.routers.watch import WS_CLOSE_LAGGED, Lagged, Watcher, watch
from kernel_pool import DoneEvent, ExecutionHandle, ExecutionStatus, StreamEvent
from tests.conftest import GatewayProcess


def watch_url(gateway: GatewayProcess, session_id: str, key: str) -> str:
    return f"{gateway.url.replace('http', 'ws', 1)}/v1/sessions/{session_id}/watch?token={key}"


def open_watch(gateway: GatewayProcess, session_id: str, tenant: str = "alpha",
               **kwargs: Any) -> ClientConnection:
    return connect(watch_url(gateway, session_id, gateway.keys[tenant]), proxy=None, **kwargs)


def frames_until(socket: ClientConnection, stop: str,
                 timeout_s: float = 30) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = []
    while True:
        frame = json.loads(socket.recv(timeout=timeout_s))
        frames.append(frame)
        if frame["type"] == stop:
            return frames


def api(gateway: GatewayProcess, method: str, path: str, **kwargs: Any) -> httpx.Response:
    return httpx.request(method, gateway.url + path, headers=gateway.headers(), timeout=60,
                         **kwargs)


def new_session(gateway: GatewayProcess) -> Iterator[str]:
    answer = api(gateway, "POST", "/v1/sessions", json={})
    assert answer.status_code == 201, answer.text
    yield answer.json()["id"]
    api(gateway, "DELETE", f"/v1/sessions/{answer.json()['id']}")


@pytest.fixture
def session_id(ui_gateway: GatewayProcess) -> Iterator[str]:
    yield from new_session(ui_gateway)


@pytest.fixture(scope="module")
def idle_session_id(ui_gateway: GatewayProcess) -> Iterator[str]:
    """A session nothing runs in, shared by the tests that are refused before any frame."""
    yield from new_session(ui_gateway)


def merged(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Frames with consecutive stdout pieces joined (the kernel may split one print)."""
    out: list[dict[str, Any]] = []
    for frame in frames:
        if out and frame["type"] == "stdout" and out[-1]["type"] == "stdout":
            out[-1] = {**out[-1], "text": out[-1]["text"] + frame["text"]}
        else:
            out.append(frame)
    return out


def test_watch_sends_history_then_live_executions(ui_gateway: GatewayProcess,
                                                  session_id: str) -> None:
    first = api(ui_gateway, "POST", f"/v1/sessions/{session_id}/execute",
                json={"code": "print('one')"}).json()
    with open_watch(ui_gateway, session_id) as socket:
        history = merged(frames_until(socket, "history_end"))
        assert [f["type"] for f in history] == ["execution", "stdout", "done", "history_end"]
        assert history[0] == {"type": "execution", "execution_id": first["id"],
                              "code": "print('one')", "started_at": history[0]["started_at"]}
        assert history[1]["text"] == "one\n" and history[1]["execution_id"] == first["id"]
        assert history[2]["status"] == "ok" and history[2]["execution_count"] == 1

        second = api(ui_gateway, "POST", f"/v1/sessions/{session_id}/execute",
                     json={"code": "print('two'); 1 + 1"}).json()
        live = merged(frames_until(socket, "done"))
        assert [f["type"] for f in live] == ["execution", "stdout", "result", "done"]
        assert {f["execution_id"] for f in live} == {second["id"]}
        assert live[2]["data"]["text/plain"] == "2"
        assert live[3]["execution_count"] == 2


def test_watch_joining_midway_sends_each_event_once(ui_gateway: GatewayProcess,
                                                    session_id: str) -> None:
    code = ("import time\nfor i in range(6):\n    print(f'step {i}', flush=True)\n"
            "    time.sleep(0.25)")
    result: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: result.update(answer=api(
        ui_gateway, "POST", f"/v1/sessions/{session_id}/execute", json={"code": code})))
    runner.start()
    try:
        with open_watch(ui_gateway, session_id) as early:
            frames_until(early, "history_end")
            frames_until(early, "stdout")  # it is running: join now, mid-way
            with open_watch(ui_gateway, session_id) as late:
                frames = frames_until(late, "done")
    finally:
        runner.join(30)
    assert result["answer"].json()["status"] == "ok"
    assert [f["type"] for f in frames].count("execution") == 1
    text = "".join(f["text"] for f in frames if f["type"] == "stdout")
    assert text == "".join(f"step {i}\n" for i in range(6))


@pytest.mark.parametrize(("tenant", "key", "origin", "code"), [
    ("alpha", "rg_wrong", None, 4401),
    ("beta", None, None, 4404),
    ("alpha", None, "http://evil.example", 4403),
])
def test_watch_refuses_before_any_frame_when_not_allowed(
        ui_gateway: GatewayProcess, idle_session_id: str, tenant: str, key: str | None,
        origin: str | None, code: int) -> None:
    url = watch_url(ui_gateway, idle_session_id, key or ui_gateway.keys[tenant])
    with (connect(url, proxy=None, origin=origin) as socket,  # type: ignore[arg-type]
          pytest.raises(ConnectionClosed) as closed):
        socket.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == code


def test_watch_closes_when_session_deleted(ui_gateway: GatewayProcess,
                                           session_id: str) -> None:
    with open_watch(ui_gateway, session_id) as socket:
        frames_until(socket, "history_end")
        assert api(ui_gateway, "DELETE", f"/v1/sessions/{session_id}").status_code == 204
        with pytest.raises(ConnectionClosed) as closed:
            socket.recv(timeout=15)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4404


# -- the broadcast itself, in process -----------------------------------------------------------


class FakeSession:
    def __init__(self) -> None:
        self.id = "s1"
        self.closed = False
        self.listeners: list[Any] = []


class FakeGateway:
    async def history(self, tenant: str, session_id: str) -> list[Any]:
        return []


class FakeSocket:
    """Records frames; blocks sending after ``block_after`` frames until released."""

    def __init__(self, block_after: int | None = None) -> None:
        self.frames: list[dict[str, Any]] = []
        self.close_code: int | None = None
        self.block_after = block_after
        self.release = asyncio.Event()

    async def send_text(self, text: str) -> None:
        self.frames.append(json.loads(text))
        if self.block_after is not None and len(self.frames) > self.block_after:
            await self.release.wait()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.close_code = code


def publish(watcher: Watcher, session: FakeSession, handle: ExecutionHandle, event: Any) -> None:
    handle.add(event)
    watcher(session, handle, event)  # type: ignore[arg-type]


async def test_watcher_marks_lagged_when_queue_full() -> None:
    watcher = Watcher(maxsize=3)
    session = FakeSession()
    handle = ExecutionHandle("e1", "print(1)", 10)
    watcher(session, handle, None)  # type: ignore[arg-type]
    for i in range(5):
        publish(watcher, session, handle, StreamEvent(type="stdout", text=f"{i}\n"))
    assert watcher.lagged
    assert watcher._queue.qsize() == 3  # bounded: what did not fit was dropped
    with pytest.raises(Lagged):
        await watcher.next(0.1)


async def test_watch_sends_lagged_and_closes_slow_watcher() -> None:
    watcher = Watcher(maxsize=4)
    session = FakeSession()
    socket = FakeSocket(block_after=1)  # history_end goes out, then the client stops reading
    sender = asyncio.create_task(watch(socket, FakeGateway(), "t", session,  # type: ignore[arg-type]
                                       watcher, []))
    handle = ExecutionHandle("e1", "print(1)", 10)
    await asyncio.sleep(0.05)
    for i in range(20):
        publish(watcher, session, handle, StreamEvent(type="stdout", text=f"{i}\n"))
    socket.release.set()
    await asyncio.wait_for(sender, 5)
    assert socket.frames[-1]["type"] == "lagged"
    assert socket.close_code == WS_CLOSE_LAGGED


async def test_watch_replays_live_execution_without_repeats(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gateway.routers.watch.CLOSED_POLL_S", 0.05)
    watcher = Watcher()
    session = FakeSession()
    handle = ExecutionHandle("e1", "print(1)", 10)
    handle.run = object()  # type: ignore[assignment]
    watcher(session, handle, None)  # type: ignore[arg-type]
    publish(watcher, session, handle, StreamEvent(type="stdout", text="a"))
    publish(watcher, session, handle, StreamEvent(type="stdout", text="b"))
    socket = FakeSocket()
    sender = asyncio.create_task(watch(socket, FakeGateway(), "t", session,  # type: ignore[arg-type]
                                       watcher, [handle]))
    await asyncio.sleep(0.05)
    publish(watcher, session, handle, StreamEvent(type="stdout", text="c"))
    publish(watcher, session, handle, DoneEvent(status=ExecutionStatus.OK, execution_count=1,
                                                duration_ms=1.0))
    await asyncio.sleep(0.05)
    session.closed = True
    await asyncio.wait_for(sender, 5)
    kinds = [(f["type"], f.get("text")) for f in socket.frames]
    assert kinds == [("execution", None), ("stdout", "a"), ("stdout", "b"), ("history_end", None),
                     ("stdout", "c"), ("done", None)]
