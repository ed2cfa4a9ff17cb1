"""Secrets brokered at the egress: a real sandbox, a real HTTPS server off this host's loopback
(tests/upstream.py: a network namespace of its own, its own CA), the sandbox's proxy
terminating TLS with the sandbox's CA and putting the secret into the requests its rules match.

The sandbox's code only ever holds the placeholder ``{secret:TOKEN}``; the server records what
it received, and answers without echoing it.
"""

from __future__ import annotations

import logging
import secrets
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import docker
import pytest

from kernel_pool import KernelPool, PoolSettings, Session
from kernel_pool._broker_rules import SecretRule
from kernel_pool._sandbox_ca import TRUST_ENV
from tests.pools import small_profile, started_pool
from tests.upstream import Upstream, upstream_server

OWNER = f"brtest-{secrets.token_hex(4)}"


class Vault:
    """The secrets the broker asks for (the gateway's store, here a dict)."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.asked: list[str] = []
        self.failing: str | None = None
        """Set: the lookup raises (a node whose gateways do not answer)."""

    async def lookup(self, name: str) -> str | None:
        self.asked.append(name)
        if self.failing is not None:
            raise ConnectionError(self.failing)
        return self.values.get(name)


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with upstream_server() as server:
        yield server


@pytest.fixture(scope="module")
async def pool(docker_client: docker.DockerClient,
               upstream: Upstream) -> AsyncIterator[KernelPool]:
    state = Path(tempfile.mkdtemp(prefix="rg-br-", dir="/tmp"))
    settings = PoolSettings(
        state_dir=state, owner=OWNER, max_kernels=2, interrupt_grace_s=1.0,
        profiles={"default": small_profile("default"), "egress": small_profile(
            "egress", egress_allow=[f"{upstream.address}:{upstream.port}"])})
    async with started_pool(docker_client, settings) as pool:
        yield pool


@pytest.fixture(scope="module")
def vault() -> Vault:
    return Vault()


@pytest.fixture(scope="module")
async def session(pool: KernelPool, upstream: Upstream, vault: Vault) -> AsyncIterator[Session]:
    session = await pool.create_session(
        "egress", env={"API_KEY": "{secret:TOKEN}", **TRUST_ENV})
    egress = session.kernel.egress
    assert egress is not None
    rules = [
        SecretRule(host=upstream.address, port=upstream.port, methods=["POST"],
                   paths=["/v1/*"], headers={"Authorization": "Bearer {secret:TOKEN}"}),
        SecretRule(host=upstream.address, port=upstream.port, paths=["/keyed/*"],
                   secrets=["TOKEN"]),
    ]
    await egress.set_broker(rules, vault.lookup, upstream_cafile=upstream.ca_file)
    yield session
    await pool.delete_session(session.id)


async def run(session: Session, code: str) -> str:
    result = await session.execute(code, 30)
    assert result.status == "ok", (result.status, result.error, result.stderr)
    return result.stdout


REQUEST = """
import os, requests
r = requests.request({method!r}, {url!r}, headers={headers}, timeout=15)
print(r.status_code, r.text.strip())
"""


def _received(upstream: Upstream, path: str) -> dict[str, str]:
    matching = [r for r in upstream.requests() if r["path"] == path]
    assert matching, f"the server received no request for {path}"
    return {k.lower(): v for k, v in matching[-1]["headers"]}


async def test_matching_request_gets_the_secret_the_sandbox_never_had(
        session: Session, upstream: Upstream, vault: Vault) -> None:
    vault.values["TOKEN"] = value = f"sk-{secrets.token_hex(16)}"
    out = await run(session, REQUEST.format(method="POST", url=upstream.url("/v1/chat"),
                                            headers="{}"))
    assert out.startswith("200 ok"), out
    assert _received(upstream, "/v1/chat")["authorization"] == f"Bearer {value}"
    assert value not in out


async def test_other_method_or_path_gets_no_secret(session: Session, upstream: Upstream,
                                                   vault: Vault) -> None:
    vault.values["TOKEN"] = f"sk-{secrets.token_hex(16)}"
    out = await run(session, REQUEST.format(method="GET", url=upstream.url("/v1/get-me"),
                                            headers="{}"))
    assert out.startswith("200 ok"), out
    assert "authorization" not in _received(upstream, "/v1/get-me")
    out = await run(session, REQUEST.format(method="POST", url=upstream.url("/v2/other"),
                                            headers="{'X-Key': os.environ['API_KEY']}"))
    assert out.startswith("200 ok"), out
    got = _received(upstream, "/v2/other")
    assert "authorization" not in got
    assert got["x-key"] == "{secret:TOKEN}"  # no rule names this path: the placeholder stays


async def test_placeholder_is_replaced_where_a_rule_names_the_secret(
        session: Session, upstream: Upstream, vault: Vault) -> None:
    vault.values["TOKEN"] = value = f"sk-{secrets.token_hex(16)}"
    out = await run(session, REQUEST.format(
        method="GET", url=upstream.url("/keyed/models"),
        headers="{'X-Api-Key': os.environ['API_KEY']}"))
    assert out.startswith("200 ok"), out
    assert _received(upstream, "/keyed/models")["x-api-key"] == value


async def test_a_replaced_secret_applies_to_the_next_request(
        session: Session, upstream: Upstream, vault: Vault) -> None:
    vault.values["TOKEN"] = "first-" + secrets.token_hex(8)
    await run(session, REQUEST.format(method="POST", url=upstream.url("/v1/one"), headers="{}"))
    vault.values["TOKEN"] = second = "second-" + secrets.token_hex(8)
    await run(session, REQUEST.format(method="POST", url=upstream.url("/v1/two"), headers="{}"))
    assert _received(upstream, "/v1/two")["authorization"] == f"Bearer {second}"


async def test_one_connection_carries_requests_and_outlives_the_host_closing(
        session: Session, upstream: Upstream, vault: Vault) -> None:
    vault.values["TOKEN"] = value = f"sk-{secrets.token_hex(16)}"
    out = await run(session, f"""
import requests, time
with requests.Session() as s:
    print(s.post({upstream.url('/v1/drop-1')!r}, timeout=15).status_code)
    time.sleep(0.3)
    print(s.post({upstream.url('/v1/after-drop')!r}, timeout=15).status_code)
    print(s.post({upstream.url('/v1/kept')!r}, timeout=15).status_code)
""")
    assert out.split() == ["200", "200", "200"], out
    for path in ("/v1/drop-1", "/v1/after-drop", "/v1/kept"):
        assert _received(upstream, path)["authorization"] == f"Bearer {value}"


async def test_a_large_body_is_relayed_whole(session: Session, upstream: Upstream,
                                             vault: Vault) -> None:
    vault.values["TOKEN"] = value = f"sk-{secrets.token_hex(16)}"
    out = await run(session, REQUEST.format(method="POST", url=upstream.url("/v1/upload"),
                                            headers="{}").replace(
        "timeout=15)", "timeout=15, data=b'x' * 300_000)"))
    assert out.startswith("200 ok"), out
    got = [r for r in upstream.requests() if r["path"] == "/v1/upload"][-1]
    assert len(got["body"]) == 300_000
    assert {k.lower(): v for k, v in got["headers"]}["authorization"] == f"Bearer {value}"


async def test_a_deleted_secret_refuses_the_request(session: Session, upstream: Upstream,
                                                    vault: Vault) -> None:
    vault.values.pop("TOKEN", None)
    out = await run(session, REQUEST.format(method="POST", url=upstream.url("/v1/gone"),
                                            headers="{}"))
    assert out.startswith("403 replgate egress refused the request: it needs the secret "
                          "'TOKEN', which does not exist"), out
    assert not [r for r in upstream.requests() if r["path"] == "/v1/gone"]


async def test_r_and_git_trust_the_sandbox_ca(session: Session, upstream: Upstream,
                                             vault: Vault) -> None:
    vault.values["TOKEN"] = value = f"sk-{secrets.token_hex(16)}"
    out = await run(session, f"""
import subprocess
r = subprocess.run(["Rscript", "-e", 'download.file("{upstream.url('/keyed/r')}", "/tmp/r.txt", '
                    'method="libcurl", quiet=TRUE, headers=c("X-Api-Key"=Sys.getenv("API_KEY")));'
                    'cat(readLines("/tmp/r.txt"))'], capture_output=True, text=True, timeout=60)
print(r.returncode, r.stdout.strip(), r.stderr.strip()[-300:])
""")
    assert out.startswith("0 ok"), out
    assert _received(upstream, "/keyed/r")["x-api-key"] == value
    out = await run(session, f"""
import subprocess
g = subprocess.run(["git", "ls-remote", "{upstream.url('/keyed/repo.git')}"],
                   capture_output=True, text=True, timeout=30)
print("certificate" in g.stderr.lower(), g.stderr.strip()[-300:])
""")
    assert out.startswith("False"), out  # git's TLS holds: its complaint is the answer's form
    assert _received(upstream, "/keyed/repo.git/info/refs?service=git-upload-pack")


async def test_deno_fetch_trusts_the_sandbox_ca(session: Session, upstream: Upstream,
                                               vault: Vault) -> None:
    vault.values["TOKEN"] = value = f"sk-{secrets.token_hex(16)}"
    script = (f"const r = await fetch('{upstream.url('/v1/deno')}', {{method: 'POST'}});"
              "console.log(r.status + ' ' + (await r.text()).trim());")
    out = await run(session, f"""
import subprocess
d = subprocess.run(["deno", "eval", {script!r}], capture_output=True, text=True, timeout=60)
print(d.returncode, d.stdout.strip(), d.stderr.strip()[-300:])
""")
    assert out.startswith("0 200 ok"), out
    assert _received(upstream, "/v1/deno")["authorization"] == f"Bearer {value}"


async def test_websocket_upgrade_then_bytes_pass(session: Session, upstream: Upstream,
                                                 vault: Vault) -> None:
    vault.values["TOKEN"] = value = f"sk-{secrets.token_hex(16)}"
    out = await run(session, f"""
import base64, os, socket, ssl
raw = socket.create_connection(("127.0.0.1", 3128), timeout=15)
raw.sendall(b"CONNECT {upstream.address}:{upstream.port} HTTP/1.1\\r\\n\\r\\n")
assert raw.recv(4096).startswith(b"HTTP/1.1 200")
tls = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"]).wrap_socket(
    raw, server_hostname="{upstream.address}")
key = base64.b64encode(os.urandom(16)).decode()
tls.sendall((f"GET /keyed/ws HTTP/1.1\\r\\nHost: {upstream.address}\\r\\n"
             f"Upgrade: websocket\\r\\nConnection: Upgrade\\r\\nSec-WebSocket-Key: {{key}}\\r\\n"
             f"Sec-WebSocket-Version: 13\\r\\nX-Api-Key: {{os.environ['API_KEY']}}\\r\\n\\r\\n"
             ).encode())
head = b""
while b"\\r\\n\\r\\n" not in head:
    head += tls.recv(4096)
print(head.split(b"\\r\\n")[0].decode())
tls.sendall(b"frames pass as bytes")
echo = b""
while len(echo) < 20:
    echo += tls.recv(4096)
print(echo.decode())
""")
    assert out.splitlines() == ["HTTP/1.1 101 Switching Protocols", "frames pass as bytes"], out
    assert _received(upstream, "/keyed/ws")["x-api-key"] == value


async def test_no_byte_of_the_secret_in_the_sandbox_or_the_log(
        session: Session, upstream: Upstream, vault: Vault,
        caplog: pytest.LogCaptureFixture) -> None:
    vault.values["TOKEN"] = value = f"sk-{secrets.token_hex(16)}"
    with caplog.at_level(logging.DEBUG):
        await run(session, REQUEST.format(method="POST", url=upstream.url("/v1/logged"),
                                          headers="{}"))
    assert _received(upstream, "/v1/logged")["authorization"] == f"Bearer {value}"
    out = await run(session, f"""
import glob, os
seen = [os.environ.get("API_KEY")]
for path in glob.glob("/proc/*/environ"):
    try:
        seen.append(open(path, "rb").read().decode("latin-1"))
    except OSError:
        pass
print({value!r} in "".join(seen), "{{secret:TOKEN}}" in "".join(seen))
""")
    assert out.split() == ["False", "True"]
    assert value not in caplog.text
    assert "secrets TOKEN put in" in caplog.text
    egress = session.kernel.egress
    assert egress is not None
    assert value not in repr(egress.attempts) and value not in repr(egress.broker)
    assert any("/v1/logged" in a.reason for a in egress.attempts)


async def test_curl_in_bash_and_httpx_go_through_the_broker(
        session: Session, upstream: Upstream, vault: Vault) -> None:
    vault.values["TOKEN"] = value = f"sk-{secrets.token_hex(16)}"
    out = await run(session, f"""
import subprocess
c = subprocess.run(["bash", "-c", 'curl -sS -X POST {upstream.url("/v1/curl")}'],
                   capture_output=True, text=True, timeout=60)
print(c.returncode, c.stdout.strip(), c.stderr.strip()[-300:])
""")
    assert out.startswith("0 ok"), out
    assert _received(upstream, "/v1/curl")["authorization"] == f"Bearer {value}"
    out = await run(session, f"""
import httpx
r = httpx.post({upstream.url('/v1/httpx')!r}, timeout=15)
print(r.status_code, r.text.strip())
""")
    assert out.startswith("200 ok"), out
    assert _received(upstream, "/v1/httpx")["authorization"] == f"Bearer {value}"


def _memory_holds(pid: int, needle: bytes) -> bool:
    """Whether any readable mapping of the (host) process ``pid`` holds ``needle``."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb")  # noqa: SIM115 (closed below)
    except OSError:  # gone meanwhile
        return False
    with mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("r"):
                continue
            start, end = (int(part, 16) for part in span.split("-"))
            try:
                mem.seek(start)
                if needle in mem.read(end - start):
                    return True
            except (OSError, OverflowError, ValueError):  # [vvar] and the like
                continue
    return False


async def test_no_process_of_the_sandbox_holds_the_secret_in_its_memory(
        session: Session, upstream: Upstream, vault: Vault,
        docker_client: docker.DockerClient) -> None:
    vault.values["TOKEN"] = value = f"sk-{secrets.token_hex(16)}"
    await run(session, REQUEST.format(method="POST", url=upstream.url("/v1/memory"),
                                      headers="{}"))
    assert _received(upstream, "/v1/memory")["authorization"] == f"Bearer {value}"
    top = docker_client.api.top(session.sandbox_info().container_id, ps_args="-eo pid")
    pids = [int(row[0]) for row in top["Processes"]]
    assert len(pids) >= 2  # PID 1 and the kernel at least
    # The check can find what it looks for: the kernel holds the placeholder it was given.
    assert any(_memory_holds(pid, b"{secret:TOKEN}") for pid in pids)
    assert not [pid for pid in pids if _memory_holds(pid, value.encode())]


async def test_a_secret_that_cannot_be_had_refuses_the_request_with_503(
        session: Session, upstream: Upstream, vault: Vault) -> None:
    """(On a node: no gateway answered.) Nothing is sent, neither without the secret nor with
    an older value."""
    vault.values["TOKEN"] = f"sk-{secrets.token_hex(16)}"
    vault.failing = "no gateway answered in 10 s"
    try:
        out = await run(session, REQUEST.format(method="POST", url=upstream.url("/v1/away"),
                                                headers="{}"))
    finally:
        vault.failing = None
    assert out.startswith("503 replgate egress refused the request: the secret 'TOKEN' could "
                          "not be had (no gateway answered in 10 s); nothing was sent"), out
    assert not [r for r in upstream.requests() if r["path"] == "/v1/away"]
    attempt = session.kernel.egress.attempts[-1] if session.kernel.egress else None
    assert attempt is not None and not attempt.allowed
    assert "secret TOKEN could not be had" in attempt.reason
