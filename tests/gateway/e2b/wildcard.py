"""Stand-ins for what a deployment gives E2B's host names: a wildcard certificate, a TLS proxy
holding it, and a wildcard DNS record.

E2B's SDK releases 2.0 to 2.6 reach ``https://api.DOMAIN`` and ``https://PORT-ID.DOMAIN`` on
port 443 (docs/e2b.md, "SDK releases"). A user puts Caddy or nginx with a ``*.DOMAIN``
certificate in front of the gateway and a ``*.DOMAIN`` DNS record pointing at it; here:

- :func:`make_certificates`: a CA and a ``*.DOMAIN`` certificate it signs (the SDK trusts the
  CA through ``SSL_CERT_FILE``, which its httpx honours);
- :func:`tls_front`: a TLS-terminating proxy on port 443 of a loopback address of its own,
  passing the bytes to the gateway's plain HTTP port;
- :func:`install_wildcard_dns`: a ``sitecustomize.py`` in the SDK's virtualenv that resolves
  ``DOMAIN`` and every name under it to that address (what the DNS record does); for the JS SDK,
  ``js/wildcard-dns.cjs`` does it, loaded with ``node --require``, and ``NODE_EXTRA_CA_CERTS``
  gives the CA.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import random
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DNS_VARIABLE = "REPLGATE_TEST_WILDCARD_DNS"
"""``DOMAIN=ADDRESS``: what the virtualenv's ``sitecustomize.py`` resolves."""

_SITECUSTOMIZE = f'''"""A test's stand-in for a wildcard DNS record (replgate's tests, wildcard.py):
with {DNS_VARIABLE}=DOMAIN=ADDRESS set, DOMAIN and every name under it resolve to ADDRESS."""
import os
import socket

_domain, _, _address = os.environ.get("{DNS_VARIABLE}", "").partition("=")
_resolve = socket.getaddrinfo


def _getaddrinfo(host, *args, **kwargs):
    if _domain and isinstance(host, str) and (host == _domain or host.endswith("." + _domain)):
        host = _address
    return _resolve(host, *args, **kwargs)


socket.getaddrinfo = _getaddrinfo
'''


def install_wildcard_dns(python: Path) -> None:
    """Put the DNS stand-in into the virtualenv of ``python`` (``DNS_VARIABLE`` turns it on)."""
    (site_packages,) = (python.parent.parent / "lib").glob("python3*/site-packages")
    (site_packages / "sitecustomize.py").write_text(_SITECUSTOMIZE)


def make_certificates(domain: str, folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate for ``domain`` and ``*.domain`` it signs: (CA, cert, key)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "replgate test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"*.{domain}")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName(domain), x509.DNSName(f"*.{domain}")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


@contextlib.contextmanager
def tls_front(cert: Path, key: Path, upstream_port: int) -> Iterator[str]:
    """A TLS proxy on port 443 of a free loopback address (yielded), to 127.0.0.1's
    ``upstream_port``, as Caddy or nginx with the wildcard certificate would be."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["http/1.1"])  # the gateway speaks HTTP/1.1
    loop = asyncio.new_event_loop()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def listen() -> tuple[asyncio.Server, str]:
        for _ in range(20):  # a loopback address no other test holds port 443 on
            address = str(ipaddress.IPv4Address("127.0.0.0") + random.randrange(2, 2**24 - 2))
            with contextlib.suppress(OSError):
                return await asyncio.start_server(serve, address, 443, ssl=context), address
        raise OSError("no loopback address with port 443 free")

    async def stop(server: asyncio.Server) -> None:
        server.close()
        connections = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in connections:
            task.cancel()
        await asyncio.gather(*connections, return_exceptions=True)

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        server, address = asyncio.run_coroutine_threadsafe(listen(), loop).result(timeout=10)
        try:
            yield address
        finally:
            asyncio.run_coroutine_threadsafe(stop(server), loop).result(timeout=10)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
