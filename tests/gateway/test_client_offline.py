"""The client without a gateway: error mapping, settings from the environment, the sync face.

``ErrorStandIn`` is a stand-in peer for error mapping only: a real HTTP/WebSocket server on
loopback that answers with canned errors (and the one canned Session needed to hold a sandbox).
It never executes code; the client's end-to-end tests run against the real gateway.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

import gateway.client
from gateway.client import (
    AsyncSandbox,
    AuthenticationError,
    InvalidRequestError,
    NotFoundError,
    RateLimitError,
    ReplgateError,
    Sandbox,
    ServerError,
    TransportError,
)
from gateway.client._sync import _Blocking, _LoopThread

GOOD = "Bearer good"
VALIDATION_DETAIL = [{"type": "greater_than", "loc": ["body", "timeout_s"],
                      "msg": "Input should be greater than 0", "input": -1}]


def session(session_id: str) -> dict[str, Any]:
    return {"id": session_id, "tenant": "default", "profile": "default", "status": "idle",
            "execution_count": 0, "created_at": "2024-05-01T12:00:00Z",
            "last_active_at": "2024-05-01T12:00:00Z"}


class ErrorStandIn:
    """A stand-in peer for error mapping only (see the module docstring); an ASGI app."""

    def __init__(self) -> None:
        self.url = ""
        self.authorizations: list[str] = []
        self.raw_paths: list[bytes] = []
        self.ws_connections: dict[str, int] = {}
        self.ws_messages: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = {key.decode(): value.decode() for key, value in scope["headers"]}
        self.authorizations.append(headers.get("authorization", ""))
        if scope["type"] == "http":
            await self._http(scope, headers, receive, send)
        elif scope["type"] == "websocket":
            await self._websocket(scope, headers, receive, send)

    async def _http(self, scope: dict[str, Any], headers: dict[str, str], receive: Any,
                    send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        method, path = scope["method"], scope["path"]
        self.raw_paths.append(scope["raw_path"])
        parts = path.strip("/").split("/")
        if headers.get("authorization") != GOOD:
            await _respond(send, 401, {"detail": "Invalid or missing API key."})
        elif method == "POST" and (path == "/v1/sessions" or path.endswith("/execute")):
            if json.loads(body).get("timeout_s", 1) <= 0:
                await _respond(send, 422, {"detail": VALIDATION_DETAIL})
            else:
                await _respond(send, 503, {"detail": "No sandbox capacity left."})
        elif method == "GET" and parts[:2] == ["v1", "sessions"] and len(parts) == 3:
            answers: dict[str, tuple[int, Any, list[tuple[bytes, bytes]]]] = {
                "busy": (429, {"detail": "Too many requests."}, [(b"retry-after", b"2")]),
                "broken": (500, b"Internal Server Error", []),
                "conflict": (409, {"detail": "The session is restarting."}, []),
                "missing": (404, {"detail": "Session not found."}, []),
            }
            status, answer, extra = answers.get(parts[2], (200, session(parts[2]), []))
            await _respond(send, status, answer, extra)
        elif method == "PUT":
            await _respond(send, 400, {"detail": "The path leaves the workspace."})
        else:
            await _respond(send, 404, {"detail": "Not Found"})

    async def _websocket(self, scope: dict[str, Any], headers: dict[str, str], receive: Any,
                         send: Any) -> None:
        await receive()  # websocket.connect
        session_id = scope["path"].split("/")[3]
        self.ws_connections[session_id] = self.ws_connections.get(session_id, 0) + 1
        if headers.get("authorization") != GOOD or session_id == "locked":
            await send({"type": "websocket.close", "code": 1008})  # before accept: HTTP 403
            return
        await send({"type": "websocket.accept"})
        message = await receive()
        self.ws_messages.append(json.loads(message["text"]))
        if session_id == "revoked":
            await send({"type": "websocket.close", "code": 4401, "reason": "API key revoked."})
        else:
            await send({"type": "websocket.close", "code": 1011, "reason": "Gateway crashed."})


async def _respond(send: Any, status: int, answer: Any,
                   extra: list[tuple[bytes, bytes]] | None = None) -> None:
    if isinstance(answer, bytes):
        payload, kind = answer, b"text/plain"
    else:
        payload, kind = json.dumps(answer).encode(), b"application/json"
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", kind), *(extra or [])]})
    await send({"type": "http.response.body", "body": payload})


@pytest.fixture(scope="module")
def standin() -> Iterator[ErrorStandIn]:
    peer = ErrorStandIn()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    peer.url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(peer, log_level="warning", lifespan="off",
                                           ws="websockets-sansio"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the stand-in did not start"
        time.sleep(0.01)
    yield peer
    server.should_exit = True
    thread.join(10)
    listener.close()


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No address nor key in the environment, and a state folder without a key file (returned:
    a test may write one there)."""
    monkeypatch.delenv("REPLGATE_URL", raising=False)
    monkeypatch.delenv("REPLGATE_API_KEY", raising=False)
    monkeypatch.setenv("REPLGATE_STATE_DIR", str(tmp_path))
    return tmp_path


def client_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "replgate-client"]


def test_exports_match_sorted_all() -> None:
    public = [name for name in dir(gateway.client) if not name.startswith("_")]

    assert gateway.client.__all__ == sorted(gateway.client.__all__)
    assert sorted(public) == gateway.client.__all__


def test_import_client_without_server_dependencies() -> None:
    heavy = ["docker", "zmq", "jupyter_client", "fastapi", "uvicorn", "nbformat", "gateway.app"]
    probe = (f"import sys, gateway.client; print([m for m in {heavy!r} if m in sys.modules])")

    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           check=True).stdout.strip()

    assert found == "[]"


async def test_create_rejects_missing_key_without_network(no_env: Path) -> None:
    with pytest.raises(AuthenticationError) as caught:
        await AsyncSandbox.create()

    assert caught.value.status_code is None
    assert "REPLGATE_API_KEY" in str(caught.value)
    assert str(no_env / "api_key") in str(caught.value)  # where it looked


async def test_create_reads_the_key_serve_stored_when_none_is_given(
        standin: ErrorStandIn, no_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLGATE_URL", standin.url)
    (no_env / "api_key").write_text("good\n")
    with pytest.raises(NotFoundError):
        await AsyncSandbox.connect("missing")
    monkeypatch.setenv("REPLGATE_API_KEY", "wrong")  # the environment's key comes first
    with pytest.raises(AuthenticationError):
        await AsyncSandbox.connect("missing")

    assert standin.authorizations[-2:] == ["Bearer good", "Bearer wrong"]


async def test_create_reads_environment_at_call_time(standin: ErrorStandIn,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLGATE_URL", standin.url)
    monkeypatch.setenv("REPLGATE_API_KEY", "wrong")
    with pytest.raises(AuthenticationError) as caught:
        await AsyncSandbox.create()
    monkeypatch.setenv("REPLGATE_API_KEY", "good")
    with pytest.raises(NotFoundError):
        await AsyncSandbox.connect("missing")

    assert standin.authorizations[-2:] == ["Bearer wrong", "Bearer good"]
    assert caught.value.status_code == 401
    assert caught.value.detail == "Invalid or missing API key."
    assert "api_key=" in str(caught.value) and "REPLGATE_API_KEY" in str(caught.value)


@pytest.mark.parametrize(("session_id", "error", "status"), [
    ("missing", NotFoundError, 404),
    ("busy", RateLimitError, 429),
    ("conflict", InvalidRequestError, 409),
    ("broken", ServerError, 500),
])
async def test_connect_maps_status_to_error(standin: ErrorStandIn, session_id: str,
                                            error: type[ReplgateError], status: int) -> None:
    with pytest.raises(error) as caught:
        await AsyncSandbox.connect(session_id, base_url=standin.url, api_key="good")

    assert caught.value.status_code == status
    assert caught.value.detail
    assert f"HTTP {status}" in str(caught.value)


async def test_connect_rate_limited_carries_retry_after(standin: ErrorStandIn) -> None:
    with pytest.raises(RateLimitError) as caught:
        await AsyncSandbox.connect("busy", base_url=standin.url, api_key="good")

    assert caught.value.retry_after == 2.0
    assert "Retry after 2 s" in str(caught.value)


async def test_create_invalid_timeout_carries_validation_detail(standin: ErrorStandIn) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        await AsyncSandbox.create(base_url=standin.url, api_key="good", timeout_s=-1)

    assert caught.value.status_code == 422
    assert caught.value.detail == VALIDATION_DETAIL
    assert "body.timeout_s: Input should be greater than 0" in str(caught.value)


async def test_create_unreachable_gateway_raises_transport_error(no_env: Path) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    closed.close()

    with pytest.raises(TransportError) as caught:
        await AsyncSandbox.create(base_url=url, api_key="good")

    assert caught.value.status_code is None
    assert url in str(caught.value) and "REPLGATE_URL" in str(caught.value)


async def test_sandbox_http_errors_surface_from_methods(standin: ErrorStandIn) -> None:
    async with await AsyncSandbox.connect("s1", base_url=standin.url, api_key="good") as sbx:
        with pytest.raises(InvalidRequestError) as refused:
            await sbx.files.write("data/a b?.txt", "x")
        with pytest.raises(NotFoundError):
            await sbx.files.read("nope.txt")
        with pytest.raises(InvalidRequestError) as invalid:
            await sbx.execute_http("1", timeout=-1)

    assert refused.value.status_code == 400
    assert b"/v1/sessions/s1/files/data/a%20b%3F.txt" in standin.raw_paths
    assert invalid.value.status_code == 422


async def test_run_code_refused_upgrade_raises_authentication_error(
        standin: ErrorStandIn) -> None:
    async with await AsyncSandbox.connect("locked", base_url=standin.url, api_key="good") as sbx:
        with pytest.raises(AuthenticationError) as caught:
            await sbx.run_code("1")

    assert caught.value.status_code == 403


async def test_run_code_close_4401_raises_authentication_error(standin: ErrorStandIn) -> None:
    async with await AsyncSandbox.connect("revoked", base_url=standin.url, api_key="good") as sbx:
        with pytest.raises(AuthenticationError) as caught:
            await sbx.run_code("print(1)", timeout=5)

    sent = standin.ws_messages[-1]
    assert caught.value.status_code == 401
    assert caught.value.detail == "API key revoked."
    assert sent["type"] == "execute" and sent["code"] == "print(1)" and sent["timeout_s"] == 5
    assert len(sent["id"]) == 36


async def test_run_code_lost_socket_reconnects_on_next_call(standin: ErrorStandIn) -> None:
    async with await AsyncSandbox.connect("flaky", base_url=standin.url, api_key="good") as sbx:
        for _ in range(2):
            with pytest.raises(TransportError) as caught:
                await sbx.run_code("1")
            assert "may still be running" in str(caught.value)

    assert standin.ws_connections["flaky"] == 2
    assert standin.ws_messages[-1]["id"] != standin.ws_messages[-2]["id"]


def test_sync_connect_raises_and_stops_thread(standin: ErrorStandIn) -> None:
    before = len(client_threads())

    with pytest.raises(NotFoundError):
        Sandbox.connect("missing", base_url=standin.url, api_key="good")

    assert len(client_threads()) == before


def test_sync_face_exposes_every_async_method(standin: ErrorStandIn) -> None:
    before = len(client_threads())
    with Sandbox.connect("s1", base_url=standin.url, api_key="good") as sbx:
        async_sbx = sbx._sandbox
        methods = [name for name, member in inspect.getmembers(async_sbx)
                   if not name.startswith("_") and inspect.iscoroutinefunction(member)
                   and name not in {"create", "connect"}]
        assert sbx.session_id == "s1"
        for name in methods:
            blocking = getattr(sbx, name)
            assert not inspect.iscoroutinefunction(blocking)
            assert inspect.signature(blocking) == inspect.signature(getattr(async_sbx, name))
        with pytest.raises(NotFoundError):
            sbx.files.read("nope.txt")
        with pytest.raises(InvalidRequestError):
            sbx.execute_http("1", timeout=-1)

    assert {"run_code", "execute_http", "interrupt", "restart", "info", "notebook",
            "close"} <= set(methods)
    assert len(client_threads()) == before
    sbx.close()  # closing again is harmless


class Counter:
    """A small real async object for the generic blocking proxy."""

    def __init__(self) -> None:
        self.total = 0
        self.child = Child()

    async def add(self, amount: int) -> str:
        await asyncio.sleep(0)
        self.total += amount
        return threading.current_thread().name

    async def fail(self) -> None:
        raise NotFoundError("gone", status_code=404)

    async def _secret(self) -> None:
        pass


class Child:
    async def double(self, value: int) -> int:
        return 2 * value


def test_blocking_proxy_runs_coroutines_on_loop_thread() -> None:
    loop = _LoopThread()
    try:
        proxy: Any = _Blocking(Counter(), loop)

        ran_on = proxy.add(3)
        doubled = proxy.child.double(21)

        assert ran_on == "replgate-client"
        assert proxy.total == 3
        assert doubled == 42
        with pytest.raises(NotFoundError):
            proxy.fail()
        with pytest.raises(AttributeError):
            proxy._secret  # noqa: B018
        assert "add" in dir(proxy)
    finally:
        loop.stop()


def test_blocking_call_from_loop_thread_raises() -> None:
    loop = _LoopThread()

    async def reenter() -> None:
        loop.run(asyncio.sleep(0))

    try:
        with pytest.raises(ReplgateError, match="callback"):
            loop.run(reenter())
    finally:
        loop.stop()
    with pytest.raises(ReplgateError, match="closed"):
        loop.run(asyncio.sleep(0))


def test_clients_share_one_verifying_tls_context_and_plain_http_loads_no_authority() -> None:
    """Each client made its own TLS context, about 20 ms of every sandbox's create."""
    from gateway.client._transport import Transport

    secure = [Transport("https://gateway.example:8443", "k")._http for _ in range(2)]
    contexts = [client._transport._pool._ssl_context for client in secure]  # type: ignore[attr-defined]
    assert contexts[0] is contexts[1]
    assert contexts[0].verify_mode == ssl.CERT_REQUIRED and contexts[0].check_hostname
    assert contexts[0].cert_store_stats()["x509_ca"] > 0, "no authority to verify with"
    plain = Transport("http://127.0.0.1:8000", "k")._http
    context = plain._transport._pool._ssl_context  # type: ignore[attr-defined]
    # An https URL such a client were sent to fails closed: nothing is trusted, nothing skipped.
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.cert_store_stats()["x509_ca"] == 0
