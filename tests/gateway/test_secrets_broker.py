"""The gateway's secrets as the egress broker gets them: sealed in a real database, opened per
request by :meth:`gateway.secrets.Secrets.lookup_for`, put into a real sandbox's HTTPS request to
a real server (tests/upstream.py); replaced and deleted through the same use cases the API
calls, and another tenant's secret of the same name never used."""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import docker
import pytest
from pydantic import SecretStr

from gateway.secrets import Secrets
from gateway.store import Store
from kernel_pool import NetworkPolicy, PoolSettings, Session
from kernel_pool._broker_rules import SecretRule, check_rules
from kernel_pool._sandbox_ca import TRUST_ENV
from tests.pools import small_profile, started_pool
from tests.upstream import Upstream, upstream_server

OWNER = f"sbtest-{secrets.token_hex(4)}"
POST = """
import os, requests
r = requests.post({url!r}, headers={{"X-Key": os.environ["API_KEY"]}}, timeout=15)
print(r.status_code, r.text.strip())
"""


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with upstream_server() as server:
        yield server


@pytest.fixture(scope="module")
async def store() -> AsyncIterator[Store]:
    folder = Path(tempfile.mkdtemp(prefix="rg-sb-"))
    async with Store.open(folder / "replgate.db") as opened:
        yield opened
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def vault(store: Store) -> Secrets:
    return Secrets(store, SecretStr(base64.b64encode(os.urandom(32)).decode()))


@pytest.fixture(scope="module")
async def session(docker_client: docker.DockerClient, upstream: Upstream,
                  vault: Secrets) -> AsyncIterator[Session]:
    state = Path(tempfile.mkdtemp(prefix="rg-sb-", dir="/tmp"))
    settings = PoolSettings(
        state_dir=state, owner=OWNER, max_kernels=2, egress_ca_file=upstream.ca_file,
        profiles={"default": small_profile("default"), "egress": small_profile(
            "egress", egress_allow=[f"{upstream.address}:{upstream.port}"])})
    async with started_pool(docker_client, settings, secret_source=vault.lookup_for) as pool:
        session = await pool.create_session("egress", tenant="alpha",
                                            env={"API_KEY": "{secret:TOKEN}"})
        # the upstream's CA is trusted through the pool's egress_ca_file
        await session.set_network(NetworkPolicy(
            default="deny", allow=[f"{upstream.address}:{upstream.port}"],
            rules=[SecretRule(host=upstream.address, port=upstream.port, secrets=["TOKEN"])]))
        assert session.kernel.proxy_env().items() >= TRUST_ENV.items()
        yield session


async def _post(session: Session, upstream: Upstream, path: str) -> tuple[str, str | None]:
    result = await session.execute(POST.format(url=upstream.url(path)), 30)
    assert result.status == "ok", result.error
    got = [r for r in upstream.requests() if r["path"] == path]
    header = {k.lower(): v for k, v in got[-1]["headers"]}.get("x-key") if got else None
    return result.stdout.strip(), header


async def test_stored_replaced_deleted_secret_reaches_the_request_or_refuses_it(
        session: Session, upstream: Upstream, vault: Secrets) -> None:
    first, second = "one-" + secrets.token_hex(12), "two-" + secrets.token_hex(12)
    await vault.put("beta", "TOKEN", "beta-" + secrets.token_hex(12))
    out, header = await _post(session, upstream, "/none")
    assert out.startswith("403") and "'TOKEN', which does not exist" in out  # beta's: not alpha's
    assert header is None

    await vault.put("alpha", "TOKEN", first)
    assert await _post(session, upstream, "/first") == ("200 ok 1", first)
    await vault.put("alpha", "TOKEN", second)
    out, header = await _post(session, upstream, "/second")
    assert header == second and out.startswith("200 ok")

    await vault.delete("alpha", "TOKEN")
    out, header = await _post(session, upstream, "/deleted")
    assert out.startswith("403") and header is None
    sealed = await vault._store.sealed_secret("beta", "TOKEN")
    assert sealed is not None and "beta-" not in sealed


async def test_rules_removed_by_a_new_policy_stop_the_broker(session: Session,
                                                             upstream: Upstream) -> None:
    policy = NetworkPolicy(default="deny", allow=[f"{upstream.address}:{upstream.port}"])
    await session.set_network(policy)
    egress = session.kernel.egress
    assert egress is not None and egress.broker is None
    assert "SSL_CERT_FILE" not in session.kernel.proxy_env()
    await session.set_network(policy.model_copy(update={"rules": [
        SecretRule(host=upstream.address, port=upstream.port, secrets=["TOKEN"])]}))
    assert egress.broker is not None


def test_rules_on_a_policy_that_allows_everything_are_refused() -> None:
    rule = SecretRule(host="api.example.com", headers={"Authorization": "Bearer {secret:X}"})
    check_rules("deny", [rule])
    check_rules("allow", [])
    with pytest.raises(ValueError, match="default is \"deny\""):
        check_rules("allow", [rule])
    with pytest.raises(ValueError, match="could send a secret to any host"):
        NetworkPolicy(default="allow", rules=[rule])


@pytest.mark.parametrize("rule", [
    {"host": "api.example.com:443"}, {"host": "bad host"}, {"host": "a.com", "paths": ["v1"]},
    {"host": "a.com", "methods": ["GE T"]}, {"host": "a.com", "headers": {"X": "a\r\nb"}},
    {"host": "a.com", "secrets": ["no}pe"]}, {"host": "a.com", "extra": 1},
])
def test_bad_rules_are_refused(rule: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        SecretRule.model_validate(rule)
