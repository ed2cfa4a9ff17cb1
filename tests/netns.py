"""A real host for network policy tests: HTTP servers in a network namespace made for the test.

A sandbox's policy never reaches loopback or the host's own addresses, so the host a test lets
a sandbox reach lives in a namespace of its own, joined to this one by a veth pair
(``10.243.N.1`` here, ``10.243.N.2`` there): an address that is neither the host's nor
loopback, which the gateway (in this namespace) reaches like any other host. Each port
answers ``hello <port> <path>``. Needs root (the test machine's runner is).
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

SERVER = """
import sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Hello(BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"hello {self.server.server_address[1]} {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

servers = [ThreadingHTTPServer((sys.argv[1], int(port)), Hello) for port in sys.argv[2:]]
for server in servers[1:]:
    threading.Thread(target=server.serve_forever, daemon=True).start()
print("ready", flush=True)
servers[0].serve_forever()
"""


@dataclass(frozen=True)
class NetnsHost:
    address: str
    """The servers' address (in the namespace)."""
    near: str
    """This namespace's end of the veth pair: one of the host's own addresses."""
    ports: tuple[int, ...]

    def url(self, port: int, path: str = "/") -> str:
        return f"http://{self.address}:{port}{path}"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def netns_host(ports: tuple[int, ...] = (18080, 18081)) -> Iterator[NetnsHost]:
    """HTTP servers on ``ports`` in a new network namespace, removed on exit."""
    tag = secrets.token_hex(3)
    name, outer, inner = f"rgnp-{tag}", f"rgnp{tag}a", f"rgnp{tag}b"
    octet = secrets.randbelow(250) + 1
    near, far = f"10.243.{octet}.1", f"10.243.{octet}.2"
    _ip("netns", "add", name)
    server: subprocess.Popen[str] | None = None
    try:
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", name)
        _ip("addr", "add", f"{near}/30", "dev", outer)
        _ip("link", "set", outer, "up")
        _ip("-n", name, "addr", "add", f"{far}/30", "dev", inner)
        _ip("-n", name, "link", "set", inner, "up")
        _ip("-n", name, "link", "set", "lo", "up")
        server = subprocess.Popen(
            ["ip", "netns", "exec", name, sys.executable, "-c", SERVER, far,
             *map(str, ports)], stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None
        assert server.stdout.readline().strip() == "ready"
        time.sleep(0.1)
        yield NetnsHost(address=far, near=near, ports=ports)
    finally:
        if server is not None:
            server.kill()
            server.wait(10)
            if server.stdout is not None:
                server.stdout.close()
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", outer)
        _ip("netns", "del", name)
