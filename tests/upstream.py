"""A real HTTPS server off this host's loopback, for egress tests: in a network namespace made
for the test, reached over a veth pair, with its own test CA.

``upstream_server()`` (root) makes the namespace ``rgup-<hex>`` (:func:`tests.netns.veth_namespace`:
a veth pair on a ``10.244.N.0/30`` no other namespace of the machine has), a CA and a
certificate for the inner address (and the name ``upstream.test``), and runs this module inside
the namespace as
the server: every request it receives is appended to a JSON-lines log (method, path, headers,
body) that the test reads with :meth:`Upstream.requests`; it answers ``200 ok <n>`` without
echoing anything it received (so the sandbox never sees an injected header). A request with
``Upgrade: websocket`` gets ``101`` and then an echo of the bytes that follow; after answering a
path holding ``/drop`` it closes the connection without saying so (a host's idle timeout).
Everything goes when the context ends.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.netns import veth_namespace

PORT = 8443
REPO = Path(__file__).resolve().parent.parent
_WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


@dataclass
class Upstream:
    """The running server: where it is, the CA that signed it, what it received."""

    address: str
    port: int
    ca_file: Path
    log: Path

    def requests(self) -> list[dict[str, Any]]:
        """What the server received so far, oldest first."""
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]

    def url(self, path: str = "/") -> str:
        return f"https://{self.address}:{self.port}{path}"


def _certificates(folder: Path, address: str) -> tuple[Path, Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "replgate test upstream CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, address)]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.IPAddress(ipaddress.ip_address(address)),
                x509.DNSName("upstream.test")]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    ca_file, cert_file, key_file = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    ca_file.write_bytes(ca.public_bytes(pem))
    cert_file.write_bytes(leaf.public_bytes(pem))
    key_file.write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return ca_file, cert_file, key_file


@contextmanager
def upstream_server(port: int = PORT) -> Iterator[Upstream]:
    """The HTTPS server in its own network namespace (needs root), on ``port``."""
    folder = Path(tempfile.mkdtemp(prefix="rg-upstream-"))
    log = folder / "requests.jsonl"
    try:
        with veth_namespace("rgup") as namespace:
            address = namespace.far
            ca_file, cert_file, key_file = _certificates(folder, address)
            with open(folder / "server.err", "wb") as errors:
                process = namespace.run(
                    [sys.executable, "-m", "tests.upstream", address, str(port),
                     str(cert_file), str(key_file), str(log)],
                    cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                    stdout=subprocess.DEVNULL, stderr=errors)
            try:
                deadline = time.monotonic() + 20
                while True:
                    try:
                        socket.create_connection((address, port), timeout=1).close()
                        break
                    except OSError:
                        if time.monotonic() > deadline or process.poll() is not None:
                            raise RuntimeError(
                                "upstream test server did not start: "
                                + (folder / "server.err").read_text()[-2000:]) from None
                        time.sleep(0.1)
                yield Upstream(address=address, port=port, ca_file=ca_file, log=log)
            finally:
                process.kill()
                process.wait()
    finally:
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # The head and the body are two writes: with Nagle's algorithm the body waits for the
    # client's delayed ACK of the head (40 ms), which a bench of requests would measure.
    disable_nagle_algorithm = True

    def _record(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        entry = {"method": self.command, "path": self.path,
                 "headers": [[k, v] for k, v in self.headers.items()],
                 "body": body.decode("latin-1")}
        log: Path = self.server.log  # type: ignore[attr-defined]
        with open(log, "a") as out:
            out.write(json.dumps(entry) + "\n")
        if self.headers.get("Upgrade", "").lower() == "websocket":
            self._websocket()
            return
        text = f"ok {len(log.read_text().splitlines())}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)
        if "/drop" in self.path:  # as a host closes an idle keep-alive: without a word
            self.close_connection = True

    def _websocket(self) -> None:
        accept = base64.b64encode(hashlib.sha1(
            (self.headers["Sec-WebSocket-Key"] + _WS_GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        while data := self.connection.recv(65536):
            self.connection.sendall(data)
        self.close_connection = True

    do_GET = do_POST = do_PUT = do_DELETE = _record

    def log_message(self, format: str, *args: object) -> None:
        pass


def _serve(address: str, port: int, cert: str, key: str, log: str) -> None:
    server = ThreadingHTTPServer((address, port), _Handler)
    server.log = Path(log)  # type: ignore[attr-defined]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.serve_forever()


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]), *sys.argv[3:6])
