"""Egress allowlist profiles: a sandbox reaches listed hosts through the gateway's proxy, only.

Real containers (``--network none``) and a real HTTP server on the host's loopback acting as
the allowed host; a second one on another loopback port proves that refusals are the proxy's
doing, not an absent server. Only loopback and the link-local metadata address are ever named.
"""

from __future__ import annotations

import secrets
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import docker
import pytest

from kernel_pool import KernelPool, PoolSettings, Profile, Session
from kernel_pool._allowlist import EgressRules, parse_allow
from tests.pools import small_profile, started_pool

OWNER = f"egtest-{secrets.token_hex(4)}"


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"hello from {self.server.server_address[1]}".encode()  # type: ignore[index]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _serve() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def allowed_port() -> Iterator[int]:
    yield from _serve()


@pytest.fixture(scope="module")
def other_port() -> Iterator[int]:
    yield from _serve()


@pytest.fixture(scope="module")
async def egress_pool(docker_client: docker.DockerClient,
                      allowed_port: int) -> AsyncIterator[KernelPool]:
    state = Path(tempfile.mkdtemp(prefix="rg-eg-", dir="/tmp"))
    settings = PoolSettings(
        state_dir=state, owner=OWNER, max_kernels=4, interrupt_grace_s=1.0,
        profiles={"default": small_profile("default"),
                  "egress": small_profile("egress", egress_allow=[f"127.0.0.1:{allowed_port}"])})
    async with started_pool(docker_client, settings) as pool:
        yield pool


@pytest.fixture(scope="module")
async def egress_session(egress_pool: KernelPool) -> AsyncIterator[Session]:
    session = await egress_pool.create_session("egress")
    yield session
    await egress_pool.delete_session(session.id)


async def run(session: Session, code: str) -> str:
    result = await session.execute(code, 30)
    assert result.status == "ok", (result.status, result.error, result.stderr)
    return result.stdout


GET = """
import requests
try:
    r = requests.get({url!r}, timeout=10)
    print(r.status_code, r.text.strip())
except Exception as exc:
    print('failed', type(exc).__name__, exc)
"""


# -- through the sandbox ------------------------------------------------------------------------


async def test_request_to_allowed_host_succeeds(egress_session: Session,
                                                allowed_port: int) -> None:
    out = await run(egress_session, GET.format(url=f"http://127.0.0.1:{allowed_port}/"))
    assert out.strip() == f"200 hello from {allowed_port}"


async def test_connect_tunnel_to_allowed_host_succeeds(egress_session: Session,
                                                       allowed_port: int) -> None:
    code = f"""
import socket
s = socket.create_connection(('127.0.0.1', 3128), timeout=10)
s.sendall(b'CONNECT 127.0.0.1:{allowed_port} HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')
head = s.recv(4096)
s.sendall(b'GET / HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n')
body = b''
while chunk := s.recv(4096):
    body += chunk
print(head.split(b'\\r\\n')[0].decode(), '|', body.split(b'\\r\\n\\r\\n', 1)[1].decode())
"""
    out = await run(egress_session, code)
    assert out.strip() == f"HTTP/1.1 200 Connection established | hello from {allowed_port}"


async def test_request_to_unlisted_loopback_port_is_refused(egress_session: Session,
                                                            other_port: int) -> None:
    out = await run(egress_session, GET.format(url=f"http://127.0.0.1:{other_port}/"))
    assert out.startswith("403 replgate egress refused"), out
    assert f"port {other_port} is not allowed" in out


async def test_request_to_metadata_address_is_refused(egress_session: Session) -> None:
    out = await run(egress_session, GET.format(url="http://169.254.169.254/latest/meta-data/"))
    assert out.startswith("403"), out
    assert "raw IP address 169.254.169.254 is not on the egress allowlist" in out


async def test_https_to_unlisted_host_is_refused(egress_session: Session) -> None:
    out = await run(egress_session, GET.format(url="https://example.com/"))
    assert out.startswith("failed ProxyError"), out
    assert "403" in out


async def test_raw_socket_bypassing_proxy_has_no_route(egress_session: Session,
                                                       allowed_port: int) -> None:
    code = f"""
import socket
for address in [('127.0.0.1', {allowed_port}), ('169.254.169.254', 80)]:
    try:
        socket.create_connection(address, timeout=3).close()
        print('connected', address)
    except OSError as exc:
        print('no route', type(exc).__name__)
"""
    out = await run(egress_session, code)
    assert "connected" not in out
    assert out.count("no route") == 2


async def test_dns_does_not_resolve_in_sandbox(egress_session: Session) -> None:
    code = """
import socket
try:
    print(socket.getaddrinfo('example.com', 80))
except OSError as exc:
    print('no dns', type(exc).__name__)
"""
    assert (await run(egress_session, code)).startswith("no dns gaierror")


async def test_attempts_are_logged_with_session(egress_session: Session, allowed_port: int,
                                                other_port: int) -> None:
    await run(egress_session, GET.format(url=f"http://127.0.0.1:{allowed_port}/logged"))
    await run(egress_session, GET.format(url=f"http://127.0.0.1:{other_port}/logged"))
    proxy = egress_session.kernel.egress
    assert proxy is not None
    latest = proxy.attempts[-2:]
    assert [(a.port, a.allowed) for a in latest] == [(allowed_port, True), (other_port, False)]
    assert all(a.session_id == egress_session.id for a in latest)
    assert all(a.sandbox_id == egress_session.kernel.id for a in latest)
    assert latest[1].reason == f"port {other_port} is not allowed for 127.0.0.1"


async def test_restart_keeps_egress_working(egress_session: Session, allowed_port: int) -> None:
    await egress_session.restart()
    out = await run(egress_session, GET.format(url=f"http://127.0.0.1:{allowed_port}/"))
    assert out.strip() == f"200 hello from {allowed_port}"


async def test_default_profile_has_no_proxy(egress_pool: KernelPool) -> None:
    session = await egress_pool.create_session("default")
    try:
        # The launcher's forwarder listens in every sandbox (a policy may come at a claim),
        # and answers for the absent proxy: no network.
        code = """
import os, socket
print(sorted(k for k in os.environ if k.lower().endswith('_proxy')))
s = socket.create_connection(('127.0.0.1', 3128), timeout=3)
s.sendall(b'CONNECT example.com:443 HTTP/1.1\\r\\n\\r\\n')
print(s.recv(4096).split(b'\\r\\n')[0].decode())
print(os.path.exists('/kernel/egress.sock'))
"""
        out = await run(session, code)
        assert out.split("\n")[:3] == ["[]", "HTTP/1.1 403 No network for this sandbox",
                                       "False"]
        assert session.kernel.egress is None
    finally:
        await egress_pool.delete_session(session.id)


# -- the allowlist's decisions ----------------------------------------------------------------


async def test_rules_decide_names_ports_and_disguises() -> None:
    rules = EgressRules(["127.0.0.1:8123", "*.example.invalid:443", "localhost:9000",
                         "pypi.internal"])
    assert (await rules.decide("127.0.0.1", 8123))[0] == "127.0.0.1"
    assert (await rules.decide("::ffff:127.0.0.1", 8123))[0] == "127.0.0.1"
    assert "not allowed" in (await rules.decide("127.0.0.1", 8124))[1]
    assert "not on the egress allowlist" in (await rules.decide("10.0.0.1", 80))[1]
    assert "non-standard form" in (await rules.decide("2130706433", 80))[1]
    assert "not on the egress allowlist" in (await rules.decide("example.invalid", 443))[1]
    assert "allowed: 443" in (await rules.decide("a.example.invalid", 80))[1]
    assert "allowed: 80, 443" in (await rules.decide("pypi.internal", 8080))[1]
    # localhost is a name: it may not reach loopback unless 127.0.0.1 itself is listed
    assert (await rules.decide("localhost", 9000))[0] == "127.0.0.1"
    unlisted = EgressRules(["localhost:9000"])
    address, reason = await unlisted.decide("localhost", 9000)
    assert address is None and "refused unless that address is listed" in reason


@pytest.mark.parametrize("entry", ["*", "a*b.example", "host:0", "host:http", "[::1",
                                   "two words"])
def test_parse_allow_rejects_bad_entry(entry: str) -> None:
    with pytest.raises(ValueError, match="egress_allow entry"):
        parse_allow([entry])


def test_profile_rejects_bad_egress_entry() -> None:
    with pytest.raises(ValueError, match="egress_allow entry"):
        Profile(name="x", egress_allow=["*"])
