"""Mutual TLS between gateways and nodes: a cluster's certificates and the contexts using them.

Gateways and nodes trust one CA (``REPLGATE_TLS_CA``) and nothing else: a node refuses a client
without a certificate of that CA, and a gateway refuses a node whose certificate is not of it.
:func:`make_cluster_certs` makes such a CA and the two certificates a local cluster needs (one
for the nodes, one for the gateways); a real deployment may bring its own (cert-manager, a
company CA), as long as node certificates allow ``serverAuth`` and name the address gateways
reach them on, and gateway certificates allow ``clientAuth``.

The node serves with uvicorn: :func:`uvicorn_ssl_options` is what ``replgate node`` passes to
it, the same TLS as :func:`server_context`. The gateway's client is httpx
(``httpx.AsyncClient(verify=client_context(...))``).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from pydantic import BaseModel

__all__ = [
    "ClusterCerts",
    "client_context",
    "make_cluster_certs",
    "server_context",
    "uvicorn_ssl_options",
]

CA_DAYS = 3650
LEAF_DAYS = 825
"""How long the certificates :func:`make_cluster_certs` makes are valid."""
_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
"""TLS 1.2's suites: forward secrecy and AEAD only (TLS 1.3's are all of that already)."""


class ClusterCerts(BaseModel):
    """The PEM files of a cluster: its CA, the nodes' pair and the gateways' pair."""

    ca: Path
    node_cert: Path
    node_key: Path
    gateway_cert: Path
    gateway_key: Path


def make_cluster_certs(folder: Path, *, names: Sequence[str] = ("localhost",),
                       ips: Sequence[str] = ("127.0.0.1",)) -> ClusterCerts:
    """A CA (``ca.pem``, ``ca-key.pem``) and, signed by it, the nodes' certificate
    (``node.pem``, ``node-key.pem``: ``serverAuth`` and ``clientAuth``, valid for the DNS
    ``names`` and ``ips`` gateways reach nodes at) and the gateways' (``gateway.pem``,
    ``gateway-key.pem``: ``clientAuth``), in ``folder`` (made, 0700, if needed). Keys are 0600.

    Files already there are kept: a second call returns the same certificates. A CA missing
    either of its files is made anew, and both pairs with it (they would not verify against
    the new one). Blocking file I/O: from async code, run it in a worker thread.
    """
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    certs = ClusterCerts(ca=folder / "ca.pem", node_cert=folder / "node.pem",
                         node_key=folder / "node-key.pem", gateway_cert=folder / "gateway.pem",
                         gateway_key=folder / "gateway-key.pem")
    ca_key_path = folder / "ca-key.pem"
    fresh_ca = not (certs.ca.exists() and ca_key_path.exists())
    if fresh_ca:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = _ca_certificate(ca_key)
        _write(ca_key_path, _key_pem(ca_key), private=True)
        _write(certs.ca, ca_cert.public_bytes(serialization.Encoding.PEM))
    else:
        loaded = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{ca_key_path} is not an EC key made by make_cluster_certs")
        ca_key, ca_cert = loaded, x509.load_pem_x509_certificate(certs.ca.read_bytes())
    san: list[x509.GeneralName] = [x509.DNSName(name) for name in names]
    san += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    leaves: list[tuple[Path, Path, str, list[x509.ObjectIdentifier], list[x509.GeneralName]]] = [
        (certs.node_cert, certs.node_key, "replgate node",
         [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH], san),
        (certs.gateway_cert, certs.gateway_key, "replgate gateway",
         [ExtendedKeyUsageOID.CLIENT_AUTH], []),
    ]
    for cert_path, key_path, name, usages, alt_names in leaves:
        if fresh_ca or not (cert_path.exists() and key_path.exists()):
            key = ec.generate_private_key(ec.SECP256R1())
            cert = _leaf_certificate(key, name, usages, alt_names, ca_key, ca_cert)
            _write(key_path, _key_pem(key), private=True)
            _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return certs


def server_context(cert: Path, key: Path, ca: Path) -> ssl.SSLContext:
    """A node's TLS: it presents ``cert``, and refuses any client without a certificate
    signed by ``ca`` (TLS 1.2 at least; 1.3 when the client has it)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.load_verify_locations(ca)
    context.verify_mode = ssl.CERT_REQUIRED
    return _harden(context)


def client_context(cert: Path, key: Path, ca: Path, *,
                   check_hostname: bool = True) -> ssl.SSLContext:
    """A gateway's TLS toward nodes: it trusts only ``ca`` (not the system's CAs), presents
    ``cert``, and checks the node's certificate names the address it dials unless
    ``check_hostname`` is False (nodes whose addresses are not known when their certificate
    is made: any certificate of ``ca`` is then accepted)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca))
    context.load_cert_chain(cert, key)
    context.check_hostname = check_hostname
    return _harden(context)


def uvicorn_ssl_options(cert: Path, key: Path, ca: Path) -> dict[str, Any]:
    """The keyword arguments of ``uvicorn.Config`` (0.47 or later) that serve as
    :func:`server_context` does: uvicorn builds its context from the files (keeping what its
    protocol adds, such as ALPN) and hands it to a factory that sets the rest."""

    def factory(_config: Any, default: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        return _harden(default())

    return {"ssl_certfile": str(cert), "ssl_keyfile": str(key), "ssl_ca_certs": str(ca),
            "ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_context_factory": factory}


def _harden(context: ssl.SSLContext) -> ssl.SSLContext:
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(_CIPHERS)
    return context


def _ca_certificate(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "replgate cluster CA")])
    now = datetime.datetime.now(datetime.UTC)
    public = key.public_key()
    return (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=False, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )


def _leaf_certificate(key: ec.EllipticCurvePrivateKey, common_name: str,
                      usages: list[x509.ObjectIdentifier], alt_names: list[x509.GeneralName],
                      ca_key: ec.EllipticCurvePrivateKey,
                      ca_cert: x509.Certificate) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    public = key.public_key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject).public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
            ca_key.public_key()), critical=False)
    )
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    # A key is 0600 from its creation (never readable by others for an instant), and made so
    # if the file was there before with wider rights.
    mode = 0o600 if private else 0o644
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as file:
        os.fchmod(file.fileno(), mode)
        file.write(data)
