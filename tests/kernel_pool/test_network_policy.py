"""A session's network policy on real sandboxes: attached to a warm kernel at its claim,
changed on a live session, kept across restart, pause, resume and fork.

The host the sandbox may reach is a real HTTP server in a network namespace made for the test
(:mod:`tests.netns`): loopback and the host's own addresses are never reachable by a policy.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import docker
import pytest

from kernel_pool import KernelPool, NetworkPolicy, PoolSettings, Session
from tests.netns import NetnsHost, netns_host
from tests.pools import small_profile, started_pool

OWNER = "nptest"
ALLOWED, OTHER = 18080, 18081

GET = """
import requests
for url in {urls!r}:
    try:
        r = requests.get(url, timeout=10)
        print(r.status_code, r.text.strip()[:200])
    except Exception as exc:
        print('failed', type(exc).__name__, str(exc)[:200])
"""


@pytest.fixture(scope="module")
def host() -> Iterator[NetnsHost]:
    with netns_host((ALLOWED, OTHER)) as made:
        yield made


@pytest.fixture(scope="module")
async def pool(docker_client: docker.DockerClient) -> AsyncIterator[KernelPool]:
    state = Path(tempfile.mkdtemp(prefix="rg-np-", dir="/tmp"))
    settings = PoolSettings(
        state_dir=state, owner=f"{OWNER}-{state.name[-6:]}", max_kernels=5,
        interrupt_grace_s=1.0,
        profiles={"default": small_profile("default"),
                  "open": small_profile("open", min_idle=1, network_max={"default": "allow"})})
    async with started_pool(docker_client, settings) as made:
        yield made


async def run(session: Session, code: str) -> list[str]:
    result = await session.execute(code, 60)  # a kernel start took 18 s on a loaded machine
    assert result.status == "ok", (result.status, result.error, result.stdout, result.stderr)
    return result.stdout.strip().split("\n")


def only(host: NetnsHost, port: int = ALLOWED) -> NetworkPolicy:
    return NetworkPolicy(allow=[f"{host.address}:{port}"])


@pytest.fixture
async def session(pool: KernelPool, host: NetnsHost) -> AsyncIterator[Session]:
    await pool.wait_ready()
    warm = {kernel.id for kernel in pool._idle["open"]}
    made = await pool.create_session("open")
    assert made.kernel.id in warm, "the session took a warm kernel"
    await made.set_network(only(host))
    yield made
    await pool.delete_session(made.id)


async def test_policy_attached_at_claim_lets_a_warm_kernel_reach_the_allowed_host_only(
        session: Session, host: NetnsHost) -> None:
    assert session.kernel.state.value == "ready" and session.network == only(host)
    out = await run(session, GET.format(urls=[host.url(ALLOWED, "/a"), host.url(OTHER, "/b")]))
    assert out[0] == f"200 hello {ALLOWED} /a"
    assert out[1].startswith("403 replgate egress refused"), out
    assert "not on the allow list" in out[1]
    # Shell commands get the proxy's variables too.
    fetch = f"import urllib.request as u; print(u.urlopen({host.url(ALLOWED, '/sh')!r}).read())"
    result = await session.run_command(f'python3 -c "{fetch}"', timeout_s=20)
    assert result.stdout.strip() == f"b'hello {ALLOWED} /sh'", result
    attempts = await session.egress_attempts()
    assert [(a.port, a.allowed) for a in attempts[-3:]] == [
        (ALLOWED, True), (OTHER, False), (ALLOWED, True)]
    assert all(a.session_id == session.id for a in attempts)


async def test_a_changed_policy_decides_the_next_connection(session: Session,
                                                            host: NetnsHost) -> None:
    began = time.monotonic()
    await session.set_network(only(host, OTHER))
    assert time.monotonic() - began < 1.0  # applied: the very next connection is decided by it
    out = await run(session, GET.format(urls=[host.url(ALLOWED), host.url(OTHER)]))
    assert out[0].startswith("403") and out[1] == f"200 hello {OTHER} /"
    await session.set_network(None)  # the profile's own network: none
    out = await run(session, GET.format(urls=[host.url(OTHER)]))
    assert out[0].startswith("failed ProxyError") or out[0].startswith("403"), out


async def test_guarded_addresses_stay_unreachable_under_default_allow(
        session: Session, host: NetnsHost) -> None:
    await session.set_network(NetworkPolicy(default="allow", allow=[f"{host.near}:{ALLOWED}"]))
    out = await run(session, GET.format(urls=[
        host.url(ALLOWED), f"http://{host.near}:{ALLOWED}/", "http://169.254.169.254/",
        "http://172.17.0.1/", "http://0.0.0.0:8080/"]))
    assert out[0] == f"200 hello {ALLOWED} /"
    assert all(line.startswith("403") and "guarded" in line for line in out[1:]), out


async def test_restart_pause_resume_and_fork_keep_the_policy(pool: KernelPool, session: Session,
                                                             host: NetnsHost) -> None:
    urls = [host.url(ALLOWED), host.url(OTHER)]
    await session.restart()
    out = await run(session, GET.format(urls=urls))
    assert out[0] == f"200 hello {ALLOWED} /" and out[1].startswith("403"), out
    await session.pause()
    await session.resume()
    assert session.network == only(host)
    out = await run(session, GET.format(urls=urls))
    assert out[0] == f"200 hello {ALLOWED} /" and out[1].startswith("403"), out
    [child] = await pool.fork_session(session.id, 1)
    try:
        assert child.network == only(host)
        out = await run(child, GET.format(urls=urls))  # type: ignore[arg-type]
        assert out[0] == f"200 hello {ALLOWED} /" and out[1].startswith("403"), out
    finally:
        await pool.delete_session(child.id)


async def test_a_session_without_a_policy_gets_no_network(pool: KernelPool,
                                                          host: NetnsHost) -> None:
    session = await pool.create_session("open")
    try:
        assert session.network is None and session.kernel.egress is None
        out = await run(session, GET.format(urls=[host.url(ALLOWED)]))
        assert out[0].startswith("failed ConnectionError"), out  # no proxy variables, no route
    finally:
        await pool.delete_session(session.id)
