"""A claim asks nothing of the kernel: the session's variables (its ``env``, its network
policy's proxy and CA bundle) reach a warm kernel through the file it reads before each
execution, and the CA for secret rules was made as the kernel started.

Real sandboxes and a real HTTPS server off this host's loopback (tests/upstream.py); the only
thing replaced is the pool's own ``Kernel.set_env``, by one that fails the test if called.
"""

from __future__ import annotations

import secrets
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import docker
import pytest

from kernel_pool import KernelPool, NetworkPolicy, PoolSettings, Session
from kernel_pool._broker import SecretLookup
from kernel_pool._broker_rules import SecretRule
from tests.pools import small_profile, started_pool
from tests.upstream import Upstream, upstream_server

OWNER = f"cetest-{secrets.token_hex(4)}"
TOKEN = f"sk-{secrets.token_hex(16)}"


async def lookup(name: str) -> str | None:
    return TOKEN if name == "TOKEN" else None


def source(tenant: str, session_id: str | None = None) -> SecretLookup:
    return lookup


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with upstream_server() as server:
        yield server


@pytest.fixture(scope="module")
async def pool(docker_client: docker.DockerClient,
               upstream: Upstream) -> AsyncIterator[KernelPool]:
    state = Path(tempfile.mkdtemp(prefix="rg-ce-", dir="/tmp"))
    settings = PoolSettings(
        state_dir=state, owner=OWNER, max_kernels=3, interrupt_grace_s=1.0,
        egress_ca_file=upstream.ca_file,
        profiles={"default": small_profile("default"),
                  "open": small_profile("open", min_idle=1,
                                        network_max={"default": "allow"})})
    async with started_pool(docker_client, settings, secret_source=source) as made:
        yield made


async def run(session: Session, code: str) -> list[str]:
    result = await session.execute(code, 60)
    assert result.status == "ok", (result.status, result.error, result.stdout, result.stderr)
    return result.stdout.strip().split("\n")


FIRST_CELL = """
import os, requests
r = requests.get({url!r}, timeout=15)
print(r.status_code, r.text.strip()[:100])
print(os.environ.get('GREETING'), os.environ.get('HTTPS_PROXY'))
"""


async def test_policy_and_env_set_at_claim_apply_to_the_first_cell_without_a_round_trip(
        pool: KernelPool, upstream: Upstream, monkeypatch: pytest.MonkeyPatch) -> None:
    await pool.wait_ready()
    warm = list(pool._idle["open"])
    assert warm
    for kernel in warm:
        assert kernel.takes_env_file, "the image's kernel reads the session's env file"
        assert kernel.ca is not None, "the CA for secret rules was made as the kernel started"

        async def refuse(env: dict[str, str]) -> None:
            raise AssertionError(f"a round trip to the kernel at the claim: set_env({env})")

        monkeypatch.setattr(kernel, "set_env", refuse)
    session = await pool.create_session("open", env={"GREETING": "hello"})
    try:
        assert session.kernel in warm
        rule = SecretRule(host=upstream.address, port=upstream.port,
                          headers={"Authorization": "Bearer {secret:TOKEN}"})
        await session.set_network(NetworkPolicy(
            allow=[f"{upstream.address}:{upstream.port}"], rules=[rule]))
        egress = session.kernel.egress
        assert egress is not None and egress.broker is not None
        assert egress.broker.ca is session.kernel.ca, "the CA made ahead brokers"
        out = await run(session, FIRST_CELL.format(url=upstream.url("/first")))
        assert out[0].startswith("200"), out
        assert out[1] == "hello http://127.0.0.1:3128", out
        got = [r for r in upstream.requests() if r["path"] == "/first"]
        assert got and dict((k.lower(), v) for k, v in got[-1]["headers"])[
            "authorization"] == f"Bearer {TOKEN}"

        # A later change of policy sets only what it changes: a variable the code set stays.
        await run(session, "import os; os.environ['GREETING'] = 'mine'")
        await session.set_network(NetworkPolicy(allow=[f"{upstream.address}:{upstream.port}"]))
        out = await run(session, "import os; print(os.environ['GREETING'])")
        assert out == ["mine"]
    finally:
        await pool.delete_session(session.id)
