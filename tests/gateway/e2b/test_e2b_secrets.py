"""E2B's header rules and secrets API through the unmodified SDK (``network={"rules": ...}``,
``Secret``), against a real gateway and two real HTTPS servers (tests/upstream.py, each in a
network namespace of its own, on 443): a rule's headers, with the secret put in at the egress,
reach the host the rule names and no other; ``Secret`` creates, lists, updates and destroys
the tenant's secrets, and no answer holds a value."""

from __future__ import annotations

import base64
import os
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx
import pytest
from e2b import Sandbox, SandboxException, Secret
from e2b.exceptions import SecretException, SecretNotFoundException

from tests.conftest import GatewayProcess, running_gateway
from tests.upstream import Upstream, upstream_server

POLICY = """
[profiles.open]
min_idle = 1
network_max = { default = "allow" }
"""
ALL_TRAFFIC = "0.0.0.0/0"
GET = ("python3 -c \"import sys, requests, urllib3; urllib3.disable_warnings()\n"
       "r = requests.get(sys.argv[1], timeout=15, verify=False)\n"
       "print(r.status_code, r.text.strip())\" ")

pytestmark = pytest.mark.usefixtures("e2b_env")


@pytest.fixture(scope="module")
def ruled() -> Iterator[Upstream]:
    with upstream_server(port=443) as server:
        yield server


@pytest.fixture(scope="module")
def other() -> Iterator[Upstream]:
    with upstream_server(port=443) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(docker_client: docker.DockerClient, ruled: Upstream,
            other: Upstream) -> Iterator[GatewayProcess]:
    folder = Path(tempfile.mkdtemp(prefix="rg-e2bsec-", dir="/tmp"))
    (folder / "policy.toml").write_text(POLICY)
    (folder / "cas.pem").write_bytes(ruled.ca_file.read_bytes() + other.ca_file.read_bytes())
    with running_gateway(docker_client, policy_file=str(folder / "policy.toml"), min_idle="0",
                         secrets_key=base64.b64encode(os.urandom(32)).decode(),
                         egress_ca_file=str(folder / "cas.pem")) as process:
        yield process


def _get(sandbox: Sandbox, url: str) -> str:
    return sandbox.commands.run(GET + url, timeout=90).stdout.strip()


def _headers(upstream: Upstream, path: str) -> dict[str, str]:
    got = [r for r in upstream.requests() if r["path"] == path]
    assert got, f"the server received nothing for {path}"
    return {k.lower(): v for k, v in got[-1]["headers"]}


def test_a_rules_headers_and_secret_reach_its_host_and_no_other(
        gateway: GatewayProcess, ruled: Upstream, other: Upstream) -> None:
    value, renewed = f"sk-e2b-{secrets.token_hex(16)}", f"sk-new-{secrets.token_hex(16)}"
    made = Secret.create("Rule-Token", value, metadata={"team": "net"})
    assert (made.name, made.version, made.metadata) == ("rule-token", 1, {"team": "net"})
    rules = {ruled.address: [{"transform": {"headers": {
        "Authorization": f"Bearer {Secret.fill('Rule-Token')}", "X-Static": "on"}}}]}
    with Sandbox.create(template="open", network={
            "allow_out": [ruled.address, other.address], "deny_out": [ALL_TRAFFIC],
            "rules": rules}) as sandbox:
        assert _get(sandbox, ruled.url("/ruled")).startswith("200 ok")
        received = _headers(ruled, "/ruled")
        assert received["authorization"] == f"Bearer {value}"
        assert received["x-static"] == "on"
        assert _get(sandbox, other.url("/other")).startswith("200 ok")
        assert "authorization" not in _headers(other, "/other")
        assert "x-static" not in _headers(other, "/other")

        info = sandbox.get_info()
        assert info.network is not None
        assert info.network["rules"] == {ruled.address: [{"transform": {"headers": {
            "Authorization": "Bearer ${e2b.secrets.rule-token}", "X-Static": "on"}}}]}
        assert value not in repr(info)
        assert value not in sandbox.commands.run("env").stdout

        assert Secret.update(made.secret_id, renewed).version == 2
        assert _get(sandbox, ruled.url("/renewed")).startswith("200 ok")
        assert _headers(ruled, "/renewed")["authorization"] == f"Bearer {renewed}"

        sandbox.update_network({"allow_out": [ruled.address], "deny_out": [ALL_TRAFFIC]})
        assert _get(sandbox, ruled.url("/unruled")).startswith("200 ok")
        assert "authorization" not in _headers(ruled, "/unruled")
        assert "rules" not in (sandbox.get_info().network or {})
    Secret.destroy(made.secret_id)
    assert value.encode() not in gateway.log_path.read_bytes()
    assert renewed.encode() not in gateway.log_path.read_bytes()


def test_the_secrets_api_keeps_names_versions_and_metadata_and_never_a_value(
        gateway: GatewayProcess) -> None:
    value = f"v-{secrets.token_hex(12)}"
    created = [Secret.create(name, value) for name in ("page-a", "page-b", "page-c")]
    try:
        assert all(info.secret_id.startswith("sec_") for info in created)
        assert Secret.get_info(created[0].secret_id).name == "page-a"
        assert Secret.get_info("PAGE-B").secret_id == created[1].secret_id
        paginator = Secret.list(limit=2)
        first = paginator.next_items()
        assert [info.name for info in first] == ["page-a", "page-b"] and paginator.has_next
        assert [info.name for info in paginator.next_items()] == ["page-c"]
        assert not paginator.has_next
        with pytest.raises(SecretException, match="exists"):
            Secret.create("page-a", "again")
        updated = Secret.update("page-a", "second", metadata={"k": "v"})
        assert (updated.version, updated.metadata) == (2, {"k": "v"})
        assert Secret.update("page-a", "third").metadata == {"k": "v"}
        with pytest.raises(SecretNotFoundException):
            Secret.update("missing", "value")
        assert Secret.exists("page-c") and not Secret.exists("missing")
        raw = httpx.get(f"{gateway.url}/e2b/secrets", headers={"X-API-Key": gateway.keys["alpha"]})
        assert raw.status_code == 200 and value not in raw.text
        assert "value" not in raw.json()[0]
        with pytest.raises(SecretException, match="at most 64 characters"):
            Secret.create("x" * 65, "value")
    finally:
        assert [Secret.destroy(info.secret_id) for info in created] == [True, True, True]
    assert Secret.destroy(created[0].secret_id) is False


@pytest.mark.parametrize(("network", "sentence"), [
    ({"allow_out": ["10.9.9.9"], "rules": {"10.9.9.9": [{"transform": {"headers": {
        "X-Key": "k"}}}]}}, "network rules need a closed network"),
    ({"allow_out": ["10.9.9.9"], "deny_out": [ALL_TRAFFIC], "rules": {"10.9.9.9": [
        {"transform": {"headers": {"X-Key": "${e2b.identity.tokens.aws}"}}}]}},
     "workload identity tokens are not available"),
    ({"allow_out": ["10.9.9.9"], "deny_out": [ALL_TRAFFIC], "rules": {"10.9.0.0/16": [
        {"transform": {"headers": {"X-Key": "k"}}}]}}, "keyed by a CIDR range"),
])
def test_rules_that_cannot_map_are_e2bs_400_with_a_sentence(
        network: dict[str, object], sentence: str) -> None:
    with pytest.raises(SandboxException, match=sentence):
        Sandbox.create(template="open", network=network)  # type: ignore[arg-type]
