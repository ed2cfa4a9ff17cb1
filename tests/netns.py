"""A real host for network policy tests: HTTP servers in a network namespace made for the test.

A sandbox's policy never reaches loopback or the host's own addresses, so the host a test lets
a sandbox reach lives in a namespace of its own, joined to this one by a veth pair
(``10.244.N.1`` here, ``10.244.N.2`` there): an address that is neither the host's nor
loopback, which the gateway (in this namespace) reaches like any other host. ``N`` is one no
other namespace of this machine uses (chosen and taken under a lock file: tests of parallel
runs make these too, and two namespaces with one subnet would take each other's traffic).
Each port answers ``hello <port> <path>``. Needs root (the test machine's runner is).
"""

from __future__ import annotations

import contextlib
import fcntl
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


LOCK = Path("/tmp/replgate-netns.lock")


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


def _free_octet() -> int:
    """A ``10.244.N.0/30`` no interface of this machine has an address in."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], check=True, capture_output=True,
                          text=True, timeout=30).stdout
    free = [n for n in range(1, 255) if f" 10.244.{n}." not in used]
    return secrets.choice(free)


@dataclass(frozen=True)
class Namespace:
    """A network namespace joined to this one by a veth pair."""

    name: str
    near: str
    """This namespace's end: one of the host's own addresses."""
    far: str
    """The other end's address, inside the namespace."""

    def run(self, command: list[str], **popen: Any) -> subprocess.Popen[Any]:
        """Start ``command`` in the namespace's network only (``nsenter --net``): unlike
        ``ip netns exec`` it gets no copy of this host's mounts, which would hold every
        loop-mounted workspace busy for as long as it runs (a paused one then cannot be
        mounted again)."""
        return subprocess.Popen(["nsenter", f"--net=/run/netns/{self.name}", *command],
                                **popen)


@contextlib.contextmanager
def veth_namespace(prefix: str) -> Iterator[Namespace]:
    """A new network namespace on a ``10.244.N.0/30`` of its own, removed on exit."""
    tag = secrets.token_hex(3)
    name, outer, inner = f"{prefix}-{tag}", f"{prefix}{tag}a", f"{prefix}{tag}b"
    _ip("netns", "add", name)
    try:
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", name)
        with open(LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            octet = _free_octet()
            near, far = f"10.244.{octet}.1", f"10.244.{octet}.2"
            _ip("addr", "add", f"{near}/30", "dev", outer)
        _ip("link", "set", outer, "up")
        _ip("-n", name, "addr", "add", f"{far}/30", "dev", inner)
        _ip("-n", name, "link", "set", inner, "up")
        _ip("-n", name, "link", "set", "lo", "up")
        yield Namespace(name=name, near=near, far=far)
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", outer)
        _ip("netns", "del", name)


@contextlib.contextmanager
def netns_host(ports: tuple[int, ...] = (18080, 18081)) -> Iterator[NetnsHost]:
    """HTTP servers on ``ports`` in a new network namespace, removed on exit."""
    with veth_namespace("rgnp") as namespace:
        server = namespace.run([sys.executable, "-c", SERVER, namespace.far,
                                *map(str, ports)], stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            assert server.stdout.readline().strip() == "ready"
            time.sleep(0.1)
            yield NetnsHost(address=namespace.far, near=namespace.near, ports=ports)
        finally:
            server.kill()
            server.wait(10)
            if server.stdout is not None:
                server.stdout.close()
