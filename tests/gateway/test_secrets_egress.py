"""Secrets through the whole gateway: a tenant stores one, a session's network policy binds it
with a rule, and the sandbox's requests to a real HTTPS server (tests/upstream.py, off this
host's loopback, its own CA trusted through ``REPLGATE_EGRESS_CA_FILE``) carry it where the rule
matches; the sandbox, its shell commands and the gateway's log hold only the placeholder."""

from __future__ import annotations

import base64
import os
import secrets
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from tests.conftest import GatewayProcess, running_gateway
from tests.upstream import Upstream, upstream_server

POLICY = """
[profiles.open]
min_idle = 1
network_max = { default = "allow" }
"""
REQUEST = """
import os, requests
r = requests.request({method!r}, {url!r}, timeout=15)
print(r.status_code, r.text.strip())
"""


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with upstream_server() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(docker_client: docker.DockerClient,
            upstream: Upstream) -> Iterator[GatewayProcess]:
    policy = Path(tempfile.mkdtemp(prefix="rg-se-", dir="/tmp")) / "policy.toml"
    policy.write_text(POLICY)
    with running_gateway(docker_client, policy_file=str(policy), min_idle="0",
                         secrets_key=base64.b64encode(os.urandom(32)).decode(),
                         egress_ca_file=str(upstream.ca_file),
                         keep_sessions_on_stop="true") as process:
        yield process


@pytest.fixture(scope="module")
def alpha(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, headers=gateway.headers("alpha"), timeout=60) as c:
        yield c


def _network(upstream: Upstream, **rule: Any) -> dict[str, Any]:
    return {"default": "deny", "allow": [f"{upstream.address}:{upstream.port}"],
            "rules": [{"host": upstream.address, "port": upstream.port, **rule}]}


def _run(client: httpx.Client, sid: str, code: str) -> str:
    answer = client.post(f"/v1/sessions/{sid}/execute", json={"code": code, "timeout_s": 40})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["error"] is None, body["error"]
    return str(body["stdout"])


def _received(upstream: Upstream, path: str) -> dict[str, str]:
    got = [r for r in upstream.requests() if r["path"] == path]
    assert got, f"the server received nothing for {path}"
    return {k.lower(): v for k, v in got[-1]["headers"]}


def test_a_sessions_rule_puts_the_tenants_secret_into_matching_requests(
        alpha: httpx.Client, gateway: GatewayProcess, upstream: Upstream) -> None:
    value = f"sk-e2e-{secrets.token_hex(16)}"
    assert alpha.put("/v1/secrets/TOKEN", json={"value": value}).status_code == 204
    created = alpha.post("/v1/sessions", json={
        "profile": "open", "env": {"API_KEY": "{secret:TOKEN}"},
        "network": _network(upstream, methods=["POST"], paths=["/v1/*"],
                            headers={"Authorization": "Bearer {secret:TOKEN}"})})
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    try:
        out = _run(alpha, sid, REQUEST.format(method="POST", url=upstream.url("/v1/e2e")))
        assert out.startswith("200 ok"), out
        assert _received(upstream, "/v1/e2e")["authorization"] == f"Bearer {value}"
        out = _run(alpha, sid, REQUEST.format(method="GET", url=upstream.url("/v1/e2e-get")))
        assert out.startswith("200 ok"), out
        assert "authorization" not in _received(upstream, "/v1/e2e-get")

        shown = alpha.get(f"/v1/sessions/{sid}/network").json()
        assert shown["rules"][0]["headers"] == {"Authorization": "Bearer {secret:TOKEN}"}
        command = alpha.post(f"/v1/sessions/{sid}/commands", json={
            "cmd": "python3 -c 'import os; print(os.environ[\"API_KEY\"], "
                   "os.environ[\"SSL_CERT_FILE\"])'"})
        assert command.json()["stdout"].split() == ["{secret:TOKEN}", "/kernel/egress-ca.pem"]

        assert alpha.delete("/v1/secrets/TOKEN").status_code == 204
        out = _run(alpha, sid, REQUEST.format(method="POST", url=upstream.url("/v1/after")))
        assert out.startswith("403 replgate egress refused the request: it needs the secret "
                              "'TOKEN'"), out
    finally:
        alpha.delete(f"/v1/sessions/{sid}")
    assert value.encode() not in gateway.log_path.read_bytes()


def test_rules_on_a_policy_that_allows_everything_are_a_422(alpha: httpx.Client,
                                                            upstream: Upstream) -> None:
    network = {**_network(upstream, headers={"X-Key": "{secret:TOKEN}"}), "default": "allow"}
    answer = alpha.post("/v1/sessions", json={"profile": "open", "network": network})
    assert answer.status_code == 422, answer.text
    assert "could send a secret to any host" in answer.text


def test_rules_hold_across_pause_resume_fork_and_a_gateway_restart(
        alpha: httpx.Client, gateway: GatewayProcess, upstream: Upstream) -> None:
    value = f"sk-kept-{secrets.token_hex(16)}"
    assert alpha.put("/v1/secrets/KEPT", json={"value": value}).status_code == 204
    created = alpha.post("/v1/sessions", json={"profile": "open", "network": _network(
        upstream, headers={"Authorization": "Bearer {secret:KEPT}"})})
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    child = None

    def check(session_id: str, path: str) -> None:
        out = _run(alpha, session_id, REQUEST.format(method="GET", url=upstream.url(path)))
        assert out.startswith("200 ok"), out
        assert _received(upstream, path)["authorization"] == f"Bearer {value}"

    try:
        assert alpha.post(f"/v1/sessions/{sid}/pause").status_code == 200
        assert alpha.post(f"/v1/sessions/{sid}/resume").status_code == 200
        check(sid, "/resumed")
        forked = alpha.post(f"/v1/sessions/{sid}/fork", json={"count": 1})
        assert forked.status_code == 201, forked.text
        child = forked.json()[0]["id"]
        check(child, "/forked")
        gateway.stop()
        gateway.start()
        check(sid, "/restarted")
        check(child, "/restarted-child")
    finally:
        for session_id in (sid, child):
            if session_id is not None:
                alpha.delete(f"/v1/sessions/{session_id}")


def test_a_session_holding_a_brokered_connection_open_is_deleted_at_once(
        alpha: httpx.Client, upstream: Upstream) -> None:
    # A keep-alive the sandbox holds to the broker (a requests.Session left open) once made a
    # DELETE wait 30 s for the connection's end.
    assert alpha.put("/v1/secrets/HELD", json={"value": "sk-held"}).status_code == 204
    created = alpha.post("/v1/sessions", json={"profile": "open", "network": _network(
        upstream, headers={"Authorization": "Bearer {secret:HELD}"})})
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    out = _run(alpha, sid, "import requests\nheld = requests.Session()\n"
                           f"print(held.get({upstream.url('/held')!r}, timeout=15).status_code)")
    assert out.strip() == "200", out
    started = time.monotonic()
    assert alpha.delete(f"/v1/sessions/{sid}").status_code == 204
    took = time.monotonic() - started
    assert took < 10, f"DELETE took {took:.1f} s"
