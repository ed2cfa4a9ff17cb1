"""Mutual TLS between gateways and nodes: a real uvicorn server with what ``replgate node``
passes it, and httpx clients with the right certificates, none, or another CA's."""

from __future__ import annotations

import asyncio
import ssl
import stat
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from node.tls import (
    ClusterCerts,
    client_context,
    make_cluster_certs,
    server_context,
    uvicorn_ssl_options,
)
from tests.conftest import free_port

REFUSED = (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)
"""How httpx reports a handshake the other side ended (TLS 1.3 tells a client its
certificate was refused after its own side of the handshake is done: on the first read)."""

Serve = Callable[..., Any]


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> ClusterCerts:
    return make_cluster_certs(tmp_path_factory.mktemp("ours"))


@pytest.fixture(scope="module")
def theirs(tmp_path_factory: pytest.TempPathFactory) -> ClusterCerts:
    return make_cluster_certs(tmp_path_factory.mktemp("theirs"))


@asynccontextmanager
async def _node(options: dict[str, Any]) -> AsyncIterator[tuple[str, list[str]]]:
    """A uvicorn server with ``options`` on a free port: its URL, and the paths it served."""
    served: list[str] = []

    async def hello(request: Request) -> PlainTextResponse:
        served.append(request.url.path)
        return PlainTextResponse("hello")

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(
        Starlette(routes=[Route("/hello", hello)]), host="127.0.0.1", port=port,
        log_config=None, lifespan="off", **options))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not task.done(), "the server did not start"
            await asyncio.sleep(0.01)
        yield f"https://127.0.0.1:{port}", served
    finally:
        server.should_exit = True
        await task


def _options(certs: ClusterCerts, how: str) -> dict[str, Any]:
    """What uvicorn is given: ``replgate node``'s keywords, or a factory of server_context."""
    if how == "uvicorn_ssl_options":
        return uvicorn_ssl_options(certs.node_cert, certs.node_key, certs.ca)
    context = server_context(certs.node_cert, certs.node_key, certs.ca)
    return {"ssl_context_factory": lambda _config, _default: context}


async def _get(url: str, verify: ssl.SSLContext) -> httpx.Response:
    async with httpx.AsyncClient(verify=verify, timeout=10) as client:
        return await client.get(f"{url}/hello")


def _gateway(certs: ClusterCerts, ca: ClusterCerts) -> ssl.SSLContext:
    return client_context(certs.gateway_cert, certs.gateway_key, ca.ca)


@pytest.fixture(params=["uvicorn_ssl_options", "server_context"])
def serve(request: pytest.FixtureRequest, ours: ClusterCerts) -> Serve:
    return lambda: _node(_options(ours, request.param))


async def test_gateway_with_our_certificate_is_served_over_tls13(
        serve: Callable[[], Any], ours: ClusterCerts) -> None:
    async with serve() as (url, served), \
            httpx.AsyncClient(verify=_gateway(ours, ours), timeout=10) as client:
        answer = await client.get(f"{url}/hello")
        version = answer.extensions["network_stream"].get_extra_info("ssl_object").version()
    assert (answer.status_code, answer.text, served) == (200, "hello", ["/hello"])
    assert version == "TLSv1.3"


async def test_client_without_certificate_is_refused(
        serve: Callable[[], Any], ours: ClusterCerts) -> None:
    anonymous = ssl.create_default_context(cafile=str(ours.ca))
    async with serve() as (url, served):
        with pytest.raises(REFUSED):
            await _get(url, anonymous)
    assert served == []


async def test_client_with_another_cas_certificate_is_refused(
        serve: Callable[[], Any], ours: ClusterCerts, theirs: ClusterCerts) -> None:
    # It trusts our CA (it would accept the node), but its own certificate is not ours.
    async with serve() as (url, served):
        with pytest.raises(REFUSED):
            await _get(url, _gateway(theirs, ours))
        assert (await _get(url, _gateway(ours, ours))).status_code == 200
    assert served == ["/hello"]


async def test_node_with_another_cas_certificate_is_refused(
        ours: ClusterCerts, theirs: ClusterCerts) -> None:
    # A node of another cluster, which would even accept our gateway's certificate.
    impostor = uvicorn_ssl_options(theirs.node_cert, theirs.node_key, ours.ca)
    async with _node(impostor) as (url, served):
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await _get(url, _gateway(ours, ours))
    assert served == []


async def test_node_certificate_must_name_the_address_unless_told_not_to(
        tmp_path: Path) -> None:
    named = make_cluster_certs(tmp_path, names=["node-a.internal"], ips=[])
    options = uvicorn_ssl_options(named.node_cert, named.node_key, named.ca)
    async with _node(options) as (url, served):
        with pytest.raises(httpx.ConnectError, match="mismatch"):
            await _get(url, _gateway(named, named))
        unchecked = client_context(named.gateway_cert, named.gateway_key, named.ca,
                                   check_hostname=False)
        assert (await _get(url, unchecked)).status_code == 200
    assert served == ["/hello"]


async def test_gateway_certificate_cannot_serve_as_a_node(ours: ClusterCerts) -> None:
    # clientAuth only: a stolen gateway key does not let anyone pose as a node.
    posing = uvicorn_ssl_options(ours.gateway_cert, ours.gateway_key, ours.ca)
    async with _node(posing) as (url, served):
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await _get(url, _gateway(ours, ours))
    assert served == []


def test_certificates_are_kept_and_keys_private(tmp_path: Path) -> None:
    certs = make_cluster_certs(tmp_path / "certs", names=["node-a", "node-b"],
                               ips=["127.0.0.1", "10.1.2.3"])
    assert stat.S_IMODE((tmp_path / "certs").stat().st_mode) == 0o700
    keys = [certs.node_key, certs.gateway_key, tmp_path / "certs" / "ca-key.pem"]
    assert {stat.S_IMODE(k.stat().st_mode) for k in keys} == {0o600}
    node = x509.load_pem_x509_certificate(certs.node_cert.read_bytes())
    san = node.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["node-a", "node-b"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == [
        "127.0.0.1", "10.1.2.3"]
    usages = node.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    gateway = x509.load_pem_x509_certificate(certs.gateway_cert.read_bytes())
    assert list(gateway.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH]

    files = sorted((tmp_path / "certs").iterdir())
    before = {path: path.read_bytes() for path in files}
    assert make_cluster_certs(tmp_path / "certs") == certs
    assert {path: path.read_bytes() for path in files} == before
    # a missing pair is made again with the same CA; the rest stays
    certs.gateway_cert.unlink()
    make_cluster_certs(tmp_path / "certs")
    after = {path: path.read_bytes() for path in files}
    changed = {path.name for path in files if after[path] != before[path]}
    assert changed == {"gateway.pem", "gateway-key.pem"}
    ca = x509.load_pem_x509_certificate(certs.ca.read_bytes())
    x509.load_pem_x509_certificate(certs.gateway_cert.read_bytes()).verify_directly_issued_by(ca)


def test_server_context_requires_tls12_and_a_client_certificate(ours: ClusterCerts) -> None:
    context = server_context(ours.node_cert, ours.node_key, ours.ca)
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    client = client_context(ours.gateway_cert, ours.gateway_key, ours.ca)
    assert (client.verify_mode, client.check_hostname) == (ssl.CERT_REQUIRED, True)
    assert client.minimum_version == ssl.TLSVersion.TLSv1_2
    # only our CA is trusted, not the system's
    assert [c["subject"] for c in client.get_ca_certs()] == [
        ((("commonName", "replgate cluster CA"),),)]

