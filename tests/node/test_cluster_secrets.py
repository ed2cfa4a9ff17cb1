"""Secrets brokered on nodes: two ``replgate node`` processes and two gateways (own processes,
own state directories, one PostgreSQL, mutual TLS, a bundle store the nodes share), and a real
HTTPS server in a network namespace made for the test (tests/upstream.py) that records the
headers it received.

The proxy of a session's sandbox runs on its node, whose broker asks a gateway for the
secret's value over the node channel at each request: the header arrives; a secret replaced
or deleted through either gateway applies to the next request; a session paused, resumed and
moved to the other node, and one whose gateways were restarted, still gets it; and no byte of
it is in the nodes' state folders, their logs, their spans or the bundles they wrote."""

from __future__ import annotations

import asyncio
import base64
import os
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from cluster_support import ADMIN_KEY, Cluster, execute, gateway_client, running_cluster
from pydantic import SecretStr

from kernel_pool.bundles import Bundles
from kernel_pool.config import BundleSettings
from tests.otlp_receiver import OtlpReceiver
from tests.upstream import Upstream, upstream_server

POLICY = """
[profiles.open]
min_idle = 1
network_max = { default = "allow" }
"""
REQUEST = """
import requests
r = requests.request({method!r}, {url!r}, timeout=30)
print(r.status_code, r.text.strip())
"""
MARKER = f"workspace-marker-{secrets.token_hex(8)}"
PIECE = 5
"""A log line may hold a piece of a value (a debug line of a WebSocket frame shows its start
and end): logs and spans are searched for every piece of this many characters. The values are
drawn from letters no log line holds in a row, so a piece found is a leak."""


def _value() -> str:
    return "".join(secrets.choice("QXZJVW") for _ in range(40))


def _pieces(value: str) -> list[bytes]:
    return [value[i:i + PIECE].encode() for i in range(len(value) - PIECE + 1)]


def _holds_a_piece(data: bytes, value: str) -> bool:
    return any(piece in data for piece in _pieces(value))
"""Written into the session's workspace: found in the bundle, so the scan reads its bytes."""


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with upstream_server() as server:
        yield server


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as otlp:
        yield otlp


@pytest.fixture(scope="module")
def cluster(docker_client: docker.DockerClient, upstream: Upstream,
            receiver: OtlpReceiver) -> Iterator[Cluster]:
    folder = Path(tempfile.mkdtemp(prefix="rg-nsec-", dir="/tmp"))
    (folder / "policy.toml").write_text(POLICY)
    nodes_env = {"REPLGATE_POLICY_FILE": str(folder / "policy.toml"),
                 "REPLGATE_EGRESS_CA_FILE": str(upstream.ca_file),
                 "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                 "OTEL_SERVICE_NAME": "replgate-node", "OTEL_TRACES_SAMPLER": "always_on",
                 "OTEL_BSP_SCHEDULE_DELAY": "100",
                 # (every frame of the channel is logged at debug level: none may hold a value)
                 "REPLGATE_LOG_LEVEL": "debug"}
    with running_cluster(docker_client, nodes=2, bundle_store=f"file://{folder}/bundles",
                         store_env=nodes_env, gateway_settings={
                             "policy_file": str(folder / "policy.toml"), "log_level": "debug",
                             "secrets_key": base64.b64encode(os.urandom(32)).decode()},
                         ) as started:
        yield started


def _network(upstream: Upstream) -> dict[str, Any]:
    return {"default": "deny", "allow": [f"{upstream.address}:{upstream.port}"],
            "rules": [{"host": upstream.address, "port": upstream.port, "methods": ["POST"],
                       "headers": {"Authorization": "Bearer {secret:TOKEN}"},
                       "secrets": ["TOKEN"]}]}


async def _post(client: httpx.AsyncClient, sid: str, upstream: Upstream, path: str,
                method: str = "POST") -> str:
    result = await execute(client, sid, REQUEST.format(method=method, url=upstream.url(path)))
    assert result["error"] is None, result
    return str(result["stdout"])


def _received(upstream: Upstream, path: str) -> dict[str, str]:
    got = [r for r in upstream.requests() if r["path"] == path]
    assert got, f"the server received nothing for {path}"
    return {k.lower(): v for k, v in got[-1]["headers"]}


def _files_hold(root: Path, needle: bytes) -> list[str]:
    """The files under ``root`` (links not followed) whose bytes hold ``needle``."""
    found = []
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            try:
                if not path.is_symlink() and path.is_file() and needle in path.read_bytes():
                    found.append(str(path))
            except OSError:  # (a socket, a file gone meanwhile)
                continue
    return found


async def _bundle_bytes(cluster: Cluster, tenant: str, sid: str) -> bytes:
    """Every part of the session's bundle, opened with the nodes' key."""
    env = cluster.nodes[0].env
    bundles = Bundles.from_settings(BundleSettings(
        store=env["REPLGATE_BUNDLE_STORE"], key=SecretStr(env["REPLGATE_BUNDLE_KEY"])))
    assert bundles is not None
    bundle = await bundles.open(tenant, sid)
    chunks = [chunk for name in bundle.manifest.parts async for chunk in bundle.read(name)]
    return b"".join(chunks)


async def test_a_session_on_a_node_gets_its_secret_from_the_gateway_and_the_node_keeps_none(
        cluster: Cluster, upstream: Upstream, receiver: OtlpReceiver) -> None:
    one, two = cluster.gateways
    first_value, second_value = _value(), _value()
    async with gateway_client(one) as first, gateway_client(two, key_of=one) as second, \
            httpx.AsyncClient(base_url=one.url, timeout=60,
                              headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as ops:
        assert (await first.put("/v1/secrets/TOKEN",
                                json={"value": first_value})).status_code == 204
        created = await first.post("/v1/sessions", json={
            "profile": "open", "env": {"API_KEY": "{secret:TOKEN}"},
            "network": _network(upstream)})
        assert created.status_code == 201, created.text
        sid, node = created.json()["id"], created.json()["node"]
        try:
            # The rule's header and the placeholder, put in on the node; not for a GET.
            code = ("import os, requests\n"
                    f"r = requests.post({upstream.url('/v1/first')!r}, timeout=30, "
                    "headers={'X-Key': os.environ['API_KEY']})\n"
                    "print(r.status_code)")
            assert (await execute(first, sid, code))["stdout"] == "200\n"
            got = _received(upstream, "/v1/first")
            assert got["authorization"] == f"Bearer {first_value}"
            assert got["x-key"] == first_value
            assert (await _post(first, sid, upstream, "/v1/get", "GET")).startswith("200")
            assert "authorization" not in _received(upstream, "/v1/get")

            # Replaced through the other gateway: the node's next request has the new value.
            assert (await second.put("/v1/secrets/TOKEN",
                                     json={"value": second_value})).status_code == 204
            assert (await _post(first, sid, upstream, "/v1/replaced")).startswith("200")
            assert _received(upstream, "/v1/replaced")["authorization"] == \
                f"Bearer {second_value}"

            # Paused and resumed on its node, then moved to the other one (its node drained).
            write = f"open('kept.txt', 'w').write({MARKER!r})"
            assert (await execute(first, sid, write))["status"] == "ok"
            assert (await first.post(f"/v1/sessions/{sid}/pause")).status_code == 200
            assert (await first.post(f"/v1/sessions/{sid}/resume")).status_code == 200
            assert (await _post(first, sid, upstream, "/v1/resumed")).startswith("200")
            assert _received(upstream, "/v1/resumed")["authorization"] == \
                f"Bearer {second_value}"
            assert (await first.post(f"/v1/sessions/{sid}/pause")).status_code == 200
            assert (await ops.post(f"/v1/nodes/{node}/drain")).status_code == 202
            try:
                assert (await _post(second, sid, upstream, "/v1/moved")).startswith("200")
                now = (await second.get(f"/v1/sessions/{sid}")).json()
                assert now["node"] not in (None, node), now
            finally:
                await ops.post(f"/v1/nodes/{node}/undrain")
            assert _received(upstream, "/v1/moved")["authorization"] == f"Bearer {second_value}"
            bundle = await _bundle_bytes(cluster, "alpha", sid)

            # Both gateways restarted: the node asks on a channel they open by themselves (a
            # shell command goes over HTTP, not the channel).
            for gateway in (one, two):
                gateway.stop()
            for gateway in (one, two):
                gateway.start()
            await asyncio.sleep(3)  # (their first look at the nodes opens the channels)
            curl = (f"curl -s -o /dev/null -w '%{{http_code}}' -X POST "
                    f"{upstream.url('/v1/restarted')}")
            ran = await first.post(f"/v1/sessions/{sid}/commands", json={"cmd": curl})
            assert ran.status_code == 200 and ran.json()["stdout"] == "200", ran.text
            assert _received(upstream, "/v1/restarted")["authorization"] == \
                f"Bearer {second_value}"

            # Deleted: refused on the node at once, nothing sent.
            assert (await second.delete("/v1/secrets/TOKEN")).status_code == 204
            out = await _post(first, sid, upstream, "/v1/deleted")
            assert out.startswith("403 replgate egress refused the request: it needs the "
                                  "secret 'TOKEN'"), out
            assert not [r for r in upstream.requests() if r["path"] == "/v1/deleted"]
        finally:
            await first.delete(f"/v1/sessions/{sid}")

    # No byte of either value on the nodes' disks, in their logs, in their spans, in the
    # bundle they wrote (which holds the workspace's files: the scan reads them).
    assert MARKER.encode() in bundle
    await asyncio.sleep(0.5)  # (the nodes' last spans exported)
    assert any(s.resource.get("service.name") == "replgate-node" for s in receiver.snapshot())
    for value in (first_value, second_value):
        needle = value.encode()
        assert needle not in bundle
        for member in cluster.nodes:
            assert _files_hold(member.state_dir, needle) == []
            assert not _holds_a_piece(member.log_path.read_bytes(), value)
        assert not [body for body in receiver.bodies if _holds_a_piece(body, value)]
        for gateway in (one, two):
            assert not _holds_a_piece(gateway.log_path.read_bytes(), value)


async def test_a_node_gets_no_secret_its_sessions_rules_do_not_name(
        cluster: Cluster, upstream: Upstream) -> None:
    """The gateway answers a node's question only for a session that node runs and whose
    rules name the secret: a sandbox's placeholder of another secret goes out unchanged."""
    one = cluster.gateways[0]
    other = f"sk-other-{secrets.token_hex(16)}"
    async with gateway_client(one) as first:
        assert (await first.put("/v1/secrets/OTHER", json={"value": other})).status_code == 204
        assert (await first.put("/v1/secrets/TOKEN",
                                json={"value": "sk-token"})).status_code == 204
        created = await first.post("/v1/sessions", json={
            "profile": "open", "env": {"OTHER": "{secret:OTHER}"},
            "network": _network(upstream)})
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        try:
            code = ("import os, requests\n"
                    f"r = requests.post({upstream.url('/v1/other')!r}, timeout=30, "
                    "headers={'X-Other': os.environ['OTHER']})\n"
                    "print(r.status_code)")
            assert (await execute(first, sid, code))["stdout"] == "200\n"
            got = _received(upstream, "/v1/other")
            assert got["x-other"] == "{secret:OTHER}" and got["authorization"] == \
                "Bearer sk-token"
        finally:
            await first.delete(f"/v1/sessions/{sid}")
