"""A certificate authority made for one sandbox, for the egress broker's TLS termination.

The broker (:mod:`kernel_pool._broker`) answers HTTPS to a host with secret rules itself, with a
certificate for that host signed by this CA; the sandbox trusts the CA through a bundle (the
system's CAs, from certifi, and this one) written beside its egress socket, ``/kernel/
egress-ca.pem`` inside, which :data:`TRUST_ENV` names for each language's clients. The CA's key
never leaves the gateway's memory; it is made when a sandbox first gets rules, and a leaf
certificate per host is made on first use and kept (one key for all the sandbox's leaves).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import ipaddress
import os
import ssl
import tempfile
from pathlib import Path

import certifi
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["BUNDLE_NAME", "SANDBOX_BUNDLE", "TRUST_ENV", "SandboxCA"]

BUNDLE_NAME = "egress-ca.pem"
SANDBOX_BUNDLE = f"/kernel/{BUNDLE_NAME}"
TRUST_ENV = {name: SANDBOX_BUNDLE for name in (
    "SSL_CERT_FILE",        # OpenSSL: Python's ssl, httpx, Ruby, R's openssl
    "REQUESTS_CA_BUNDLE",   # requests
    "CURL_CA_BUNDLE",       # curl, R's curl and httr, requests as a fallback
    "NODE_EXTRA_CA_CERTS",  # Node.js (added to its own roots)
    "DENO_CERT",            # Deno
    "GIT_SSL_CAINFO",       # git over https
)}
"""The variables that make a sandbox's clients trust its CA (a session's environment)."""

_LIFETIME = datetime.timedelta(days=30)
_BACKDATE = datetime.timedelta(hours=1)


@functools.cache
def _system_bundle() -> bytes:
    return Path(certifi.where()).read_bytes().rstrip(b"\n") + b"\n"


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


class SandboxCA:
    """One sandbox's CA, and the server contexts of the hosts it has certified."""

    def __init__(self, sandbox_id: str) -> None:
        self.sandbox_id = sandbox_id
        now = datetime.datetime.now(datetime.UTC)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        name = _name(f"replgate egress CA for sandbox {sandbox_id}"[:64])
        self.certificate = (
            x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE).not_valid_after(now + _LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()),
                           critical=False)
            .sign(self._key, hashes.SHA256()))
        self._contexts: dict[str, ssl.SSLContext] = {}

    def __repr__(self) -> str:
        return f"<SandboxCA {self.sandbox_id} {len(self._contexts)} hosts>"

    def pem(self) -> bytes:
        """The CA's certificate, PEM."""
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def bundle(self) -> bytes:
        """What the sandbox trusts: the system's CAs (certifi's) and this CA."""
        return _system_bundle() + self.pem()

    def write_bundle(self, socket_dir: Path, owner: tuple[int | None, int | None]) -> Path:
        """Place the bundle in the sandbox's socket folder (staged in a private file and
        renamed in: the folder is the sandbox's to write, and no path in it is followed)."""
        target = socket_dir / BUNDLE_NAME
        fd, staged = tempfile.mkstemp(dir=socket_dir.parent, prefix=f".{socket_dir.name}.ca-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(self.bundle())
            uid, gid = owner
            if uid is not None and os.geteuid() == 0:
                os.chown(staged, uid, gid if gid is not None else -1)
            os.chmod(staged, 0o444)
            os.rename(staged, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(staged)
            raise
        return target

    def server_context(self, host: str) -> ssl.SSLContext:
        """A TLS server context presenting a certificate for ``host`` (made once, kept)."""
        context = self._contexts.get(host)
        if context is None:
            context = self._contexts[host] = self._make_context(host)
        return context

    def _make_context(self, host: str) -> ssl.SSLContext:
        now = datetime.datetime.now(datetime.UTC)
        try:
            alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            alt = x509.DNSName(host)
        leaf = (
            x509.CertificateBuilder().subject_name(_name(host[:64]))
            .issuer_name(self.certificate.subject).public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE).not_valid_after(now + _LIFETIME)
            .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256()))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # ssl loads a chain from a file only: a 0600 file of the gateway's, gone once loaded
        fd, path = tempfile.mkstemp(prefix="rg-leaf-", suffix=".pem")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(leaf.public_bytes(serialization.Encoding.PEM) + self.pem()
                          + self._leaf_key.private_bytes(serialization.Encoding.PEM,
                                                         serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
            context.load_cert_chain(path)
        finally:
            os.unlink(path)
        # h2 for the clients that offer it (kernel_pool/_broker_h2.py), else HTTP/1.1.
        context.set_alpn_protocols(["h2", "http/1.1"])
        return context

    def close(self) -> None:
        """Forget the hosts' contexts (made again on next use)."""
        self._contexts.clear()
