"""What a session's network policy costs: a create with a policy against one without (and one
with secret rules), and a request through the egress proxy, passed through or brokered.

    python -m bench.network [--n 40] [--requests 200]   (as root: it makes network namespaces)

One gateway of this checkout, with secrets on and the upstream test server's CA trusted
(``REPLGATE_EGRESS_CA_FILE``), its ``open`` profile keeping two warm kernels and letting
sessions open the network (``network_max``). Creates alternate, without a policy, with one, and
with one holding a secret rule, each on a warm kernel (the pool refilled and quiet before each):
the policy is attached at the claim, so the difference is what attaching costs (target: within
2 ms p50). Then HTTPS GETs against tests/upstream.py's server (in a network namespace of its
own): ``direct`` from the host straight to it; from a sandbox through its proxy
(``127.0.0.1:3128``, the launcher's forwarder, the gateway's proxy and its decision), taking
turns, ``passthrough`` (CONNECT to a second such server no rule covers, the sandbox's TLS to
it) and ``brokered`` (a rule covers the first: the proxy terminates TLS with the sandbox's CA,
puts a secret in, and opens its own TLS to the server). Each kind twice: a new connection (and
TLS handshake) per request, and ``--requests`` requests on one kept-alive connection. The
figures move with the machine's load (``load``: the 1, 5 and 15 minute averages at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._figures import sandbox_image
from bench._measure import summary
from bench._peers import Replgate
from tests.upstream import Upstream, upstream_server

POLICY = """
[profiles.open]
min_idle = 2
network_max = { default = "allow" }
"""

CLIENT = r"""
import json, socket, ssl, time

def _context():
    context = ssl.create_default_context()
    context.check_hostname = False  # timing, not trust: the sandbox's CA or the server's own
    context.verify_mode = ssl.CERT_NONE
    return context

CONTEXT = _context()

def connect(host, port, proxy):
    # TCP_NODELAY, as curl, urllib3, Go and Node set it: TLS's Finished and the request are
    # two writes, and Nagle would hold the second for the first's delayed ACK (40 ms).
    raw = socket.create_connection((host, port) if proxy is None else proxy)
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if proxy is not None:
        raw.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = raw.recv(4096)
            assert chunk, head
            head += chunk
        assert head.split(b"\r\n", 1)[0].split()[1] == b"200", head[:200]
    return CONTEXT.wrap_socket(raw, server_hostname=host)

def get(tls, host, path):
    tls.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = tls.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += tls.recv(65536)

def measure(targets, n):
    # n GETs to each target ({label: (host, port, proxy)}), the targets taking turns so that
    # the machine's load weighs on each alike: on a new connection each, then on one
    # kept-alive connection per target. The first 10 of each warm up.
    out = {label: {"new_connection": [], "kept_alive": []} for label in targets}
    for i in range(10 + n):
        for label, (host, port, proxy) in targets.items():
            began = time.perf_counter()
            with connect(host, port, proxy) as tls:
                get(tls, host, f"/{label}/new/{i}")
            if i >= 10:
                out[label]["new_connection"].append((time.perf_counter() - began) * 1000)
    kept = {label: (connect(host, port, proxy), host)
            for label, (host, port, proxy) in targets.items()}
    for i in range(10 + n):
        for label, (tls, host) in kept.items():
            began = time.perf_counter()
            get(tls, host, f"/{label}/kept/{i}")
            if i >= 10:
                out[label]["kept_alive"].append((time.perf_counter() - began) * 1000)
    for tls, _ in kept.values():
        tls.close()
    return out
"""


def log(message: str) -> None:
    print(f"[bench.network {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def creates(gateway: Replgate, policies: dict[str, dict[str, Any]],
                  n: int) -> dict[str, Any]:
    """``n`` creates of each kind, interleaved (``without``: no ``network``)."""
    kinds = ["without", *policies]
    took: dict[str, list[float]] = {kind: [] for kind in kinds}
    for i in range(len(kinds) * n):
        kind = kinds[i % len(kinds)]
        body: dict[str, Any] = {"profile": "open"}
        if kind in policies:
            body["network"] = policies[kind]
        await gateway.wait_idle(2)
        await asyncio.sleep(0.2)  # the refill's Docker calls are over
        began = time.perf_counter()
        answer = await gateway.http.post("/v1/sessions", json=body)
        took[kind].append((time.perf_counter() - began) * 1000)
        answer.raise_for_status()
        await gateway.delete_session(answer.json()["id"])
    out: dict[str, Any] = {kind: summary(values) for kind, values in took.items()}
    for kind in policies:
        out[f"difference_p50_ms_{kind}"] = out[kind]["p50"] - out["without"]["p50"]
    return out


def direct(upstream: Upstream, n: int) -> dict[str, list[float]]:
    """The same HTTPS GETs from the host straight to the server (no proxy)."""
    scope: dict[str, Any] = {}
    exec(CLIENT, scope)  # the very client the sandbox runs
    measured: dict[str, dict[str, list[float]]] = scope["measure"](
        {"direct": (upstream.address, upstream.port, None)}, n)
    return measured["direct"]


async def requests(gateway: Replgate, ruled: Upstream, passed: Upstream,
                   network: dict[str, Any], n: int) -> dict[str, Any]:
    """Direct from the host to ``ruled``'s server, then from one sandbox, taking turns,
    brokered (a rule covers ``ruled``) and passthrough (no rule covers ``passed``)."""
    # Direct first: the server appends each request to its log and reads the log back, so
    # later requests cost it a little more; the proxied ones then carry that, not direct.
    straight = await asyncio.to_thread(direct, ruled, n)
    answer = await gateway.http.post("/v1/sessions",
                                     json={"profile": "open", "network": network})
    answer.raise_for_status()
    sid = answer.json()["id"]
    targets = {"brokered": (ruled.address, ruled.port, ("127.0.0.1", 3128)),
               "passthrough": (passed.address, passed.port, ("127.0.0.1", 3128))}
    try:
        # The figures go to a file of the workspace: printed, they would pass the output cap.
        result = await gateway.http_execute(sid, CLIENT + (
            f"open('figures.json', 'w').write(json.dumps(measure({targets!r}, {n})))"))
        assert result["status"] == "ok", result
        figures = await gateway.http.get(f"/v1/sessions/{sid}/files/figures.json")
        figures.raise_for_status()
        kinds: dict[str, dict[str, list[float]]] = {"direct_from_host": straight,
                                                    **figures.json()}
    finally:
        await gateway.delete_session(sid)
    got = [r for r in ruled.requests() if r["path"].startswith("/brokered/")]
    assert got and all(any(k.lower() == "authorization" for k, _ in r["headers"]) for r in got)
    assert not any(k.lower() == "authorization" for r in passed.requests()
                   for k, _ in r["headers"])
    out: dict[str, Any] = {}
    for way in ("new_connection", "kept_alive"):
        summed = {kind: summary(values[way]) for kind, values in kinds.items()}
        base = summed["direct_from_host"]["p50"]
        out[way] = {**summed, **{f"cost_p50_ms_{kind}": summed[kind]["p50"] - base
                                 for kind in ("passthrough", "brokered")}}
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with upstream_server() as ruled, upstream_server() as passed:
        policy_file = Path(tempfile.mkdtemp(prefix="rg-bench-net-", dir="/tmp")) / "policy.toml"
        policy_file.write_text(POLICY)
        Replgate.image = await asyncio.to_thread(sandbox_image, log)
        gateway = Replgate(min_idle=0, max_kernels=8, settings={
            "REPLGATE_POLICY_FILE": str(policy_file),
            "REPLGATE_SECRETS_KEY": base64.b64encode(os.urandom(32)).decode(),
            "REPLGATE_EGRESS_CA_FILE": str(ruled.ca_file)})
        try:
            await gateway.wait_idle(2)
            stored = await gateway.http.put("/v1/secrets/BENCH",
                                            json={"value": "bench-" + os.urandom(8).hex()})
            stored.raise_for_status()
            policy = {"default": "deny", "allow": [f"{ruled.address}:{ruled.port}",
                                                   f"{passed.address}:{passed.port}"]}
            rule = {"host": ruled.address, "port": ruled.port,
                    "headers": {"Authorization": "Bearer {secret:BENCH}"}}
            network = {**policy, "rules": [rule]}
            log(f"{args.n} creates of each kind: without a policy, with one, with a rule")
            results: dict[str, Any] = {"create": await creates(
                gateway, {"with_policy": policy, "with_rule": network}, args.n)}
            log(f"{args.requests} HTTPS GETs of each kind: direct, passthrough, brokered")
            results["request"] = await requests(gateway, ruled, passed, network,
                                                args.requests)
            results["load"] = os.getloadavg()
            return results
        finally:
            await gateway.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.network", description=__doc__)
    parser.add_argument("--n", type=int, default=40, help="creates of each kind")
    parser.add_argument("--requests", type=int, default=200, help="GETs of each kind")
    print(json.dumps(asyncio.run(run(parser.parse_args())), indent=2))


if __name__ == "__main__":
    main()
