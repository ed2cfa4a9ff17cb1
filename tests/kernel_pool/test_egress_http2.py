"""HTTP/2 on the terminated side of the egress broker: ``curl --http2`` in a real sandbox
negotiates h2 with the sandbox's proxy, and each of its streams is decided by the rules and
relayed to a real HTTPS server (tests/upstream.py, HTTP/1.1, in a network namespace of its own)
as an HTTP/1.1 request is: the secret goes into the matching ones only, a body larger than the
stream's window arrives whole, and streams run side by side on one connection."""

from __future__ import annotations

import re
import secrets
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import docker
import pytest

from kernel_pool import PoolSettings, Session
from kernel_pool._broker_rules import SecretRule
from kernel_pool._sandbox_ca import TRUST_ENV
from tests.pools import small_profile, started_pool
from tests.upstream import Upstream, upstream_server

OWNER = f"h2test-{secrets.token_hex(4)}"
VALUE = f"sk-h2-{secrets.token_hex(16)}"


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with upstream_server() as server:
        yield server


async def _lookup(name: str) -> str | None:
    return VALUE if name == "TOKEN" else None


@pytest.fixture(scope="module")
async def session(docker_client: docker.DockerClient,
                  upstream: Upstream) -> AsyncIterator[Session]:
    state = Path(tempfile.mkdtemp(prefix="rg-h2-", dir="/tmp"))
    settings = PoolSettings(state_dir=state, owner=OWNER, max_kernels=1, profiles={
        "egress": small_profile("egress",
                                egress_allow=[f"{upstream.address}:{upstream.port}"])})
    async with started_pool(docker_client, settings) as pool:
        session = await pool.create_session("egress", env=dict(TRUST_ENV))
        assert session.kernel.egress is not None
        await session.kernel.egress.set_broker(
            [SecretRule(host=upstream.address, port=upstream.port, methods=["POST"],
                        paths=["/h2/*"], headers={"Authorization": "Bearer {secret:TOKEN}"})],
            _lookup, upstream_cafile=upstream.ca_file)
        yield session


async def curl(session: Session, arguments: str) -> list[str]:
    """curl's answers, each as its body and the HTTP version it spoke (``ok 3 2``), run from
    the kernel, whose environment holds the proxy's variables."""
    result = await session.execute(f"""
import subprocess
c = subprocess.run("curl -sS --http2 -w '|%{{http_version}}\\n' {arguments}", shell=True,
                   capture_output=True, text=True, timeout=50)
print(c.stdout, end="")
assert c.returncode == 0, c.stderr
""", 60)
    assert result.status == "ok", (result.error, result.stdout, result.stderr)
    return [f"{body.strip()} {version}"
            for body, version in re.findall(r"(.*?)\|(\S+)\n", result.stdout, re.S)]


def _headers(upstream: Upstream, path: str) -> list[dict[str, str]]:
    return [{k.lower(): v for k, v in r["headers"]} for r in upstream.requests()
            if r["path"] == path]


async def test_curl_speaks_http2_and_only_matching_streams_get_the_secret(
        session: Session, upstream: Upstream) -> None:
    lines = await curl(session, f"-X POST {upstream.url('/h2/one')} "
                                f"{upstream.url('/h2/two')}")
    assert [line.split()[0] for line in lines] == ["ok", "ok"], lines
    assert [line.split()[-1] for line in lines] == ["2", "2"], lines
    for path in ("/h2/one", "/h2/two"):
        (got,) = _headers(upstream, path)
        assert got["authorization"] == f"Bearer {VALUE}"
        assert got["host"] == f"{upstream.address}:{upstream.port}"
    lines = await curl(session, upstream.url("/h2/get"))  # GET: the rule is POST's
    assert lines[0].split()[-1] == "2"
    assert "authorization" not in _headers(upstream, "/h2/get")[0]
    lines = await curl(session, f"-X POST {upstream.url('/other')}")
    assert "authorization" not in _headers(upstream, "/other")[0]


async def test_a_body_larger_than_the_window_and_parallel_streams_arrive_whole(
        session: Session, upstream: Upstream) -> None:
    await session.execute("open('/tmp/body', 'w').write('x' * 300_000)", 30)
    lines = await curl(session, f"--data-binary @/tmp/body {upstream.url('/h2/upload')}")
    assert lines[0].startswith("ok") and lines[0].endswith(" 2"), lines
    (got,) = [r for r in upstream.requests() if r["path"] == "/h2/upload"]
    assert len(got["body"]) == 300_000
    assert {k.lower(): v for k, v in got["headers"]}["authorization"] == f"Bearer {VALUE}"
    urls = " ".join(upstream.url(f"/h2/par-{n}") for n in range(6))
    lines = await curl(session, f"--parallel --parallel-max 6 -X POST {urls}")
    assert len(lines) == 6 and all(line.endswith(" 2") for line in lines), lines
    for n in range(6):
        assert _headers(upstream, f"/h2/par-{n}")[0]["authorization"] == f"Bearer {VALUE}"


async def test_a_missing_secret_is_refused_on_its_stream_alone(
        session: Session, upstream: Upstream) -> None:
    assert session.kernel.egress is not None and session.kernel.egress.broker is not None
    broker = session.kernel.egress.broker
    original = broker.lookup
    await session.execute("open('/tmp/refused-body', 'w').write('y' * 300_000)", 30)
    broker.lookup = lambda name: _none()
    try:  # the refused stream's body is dropped, and the connection's window given back
        lines = await curl(session, f"--data-binary @/tmp/refused-body "
                                    f"{upstream.url('/h2/refused')} {upstream.url('/free')}")
    finally:
        broker.lookup = original
    assert lines[0].startswith("replgate egress refused the request: it needs the secret "
                               "'TOKEN'"), lines
    assert not _headers(upstream, "/h2/refused")
    assert lines[-1].startswith("ok") and lines[-1].endswith(" 2"), lines
    (free,) = [r for r in upstream.requests() if r["path"] == "/free"]
    assert len(free["body"]) == 300_000
    broker.lookup = _fail  # a value that cannot be had now (on a node: no gateway answered)
    try:
        lines = await curl(session, f"-X POST {upstream.url('/h2/unhad')}")
    finally:
        broker.lookup = original
    assert "the secret 'TOKEN' could not be had (no gateway answered)" in lines[0], lines
    assert not _headers(upstream, "/h2/unhad")


async def _none() -> str | None:
    return None


async def _fail(name: str) -> str | None:
    raise RuntimeError("no gateway answered")
