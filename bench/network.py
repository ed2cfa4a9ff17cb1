"""What a session's network policy costs: a create with a policy against one without, and a
request through the egress proxy.

    python -m bench.network [--n 40] [--requests 200]   (as root: it makes a network namespace)

One gateway of this checkout, its ``open`` profile keeping two warm kernels and letting
sessions open the network (``network_max``). Creates alternate, with ``"network"`` and
without, each on a warm kernel (the pool refilled and quiet before each): the policy is
attached at the claim, so the difference is what attaching costs (target: within 2 ms p50).
Then, in a sandbox whose policy allows an HTTP server in a network namespace made for the run
(:mod:`tests.netns`), ``--requests`` GETs, each on a new connection through
``127.0.0.1:3128`` (the launcher's forwarder, the gateway's proxy, its decision and its
connection out), against the same GETs from the host straight to the server: the difference
is the cost per proxied request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._figures import sandbox_image
from bench._measure import summary
from bench._peers import Replgate
from tests.netns import NetnsHost, netns_host

POLICY = """
[profiles.open]
min_idle = 2
network_max = { default = "allow" }
"""

PORT = 18380

IN_SANDBOX = """
import json, socket, time
def get(path):
    s = socket.create_connection(("127.0.0.1", 3128))
    head = "GET http://{host}:{port}" + path + " HTTP/1.1\\r\\nHost: {host}\\r\\n\\r\\n"
    s.sendall(head.encode())
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    s.close()
    assert data.startswith(b"HTTP/1.0 200") or data.startswith(b"HTTP/1.1 200"), data[:80]
for _ in range(20):
    get("/warm")
took = []
for i in range({n}):
    began = time.perf_counter()
    get("/" + str(i))
    took.append((time.perf_counter() - began) * 1000)
print(json.dumps(took))
"""


def log(message: str) -> None:
    print(f"[bench.network {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def creates(gateway: Replgate, policy: dict[str, Any], n: int) -> dict[str, Any]:
    took: dict[str, list[float]] = {"without": [], "with_policy": []}
    for i in range(2 * n):
        name = "with_policy" if i % 2 else "without"
        body: dict[str, Any] = {"profile": "open"}
        if name == "with_policy":
            body["network"] = policy
        await gateway.wait_idle(2)
        await asyncio.sleep(0.2)  # the refill's Docker calls are over
        began = time.perf_counter()
        answer = await gateway.http.post("/v1/sessions", json=body)
        took[name].append((time.perf_counter() - began) * 1000)
        answer.raise_for_status()
        await gateway.delete_session(answer.json()["id"])
    out = {name: summary(values) for name, values in took.items()}
    out["difference_p50_ms"] = out["with_policy"]["p50"] - out["without"]["p50"]
    return out


def direct(host: NetnsHost, n: int) -> list[float]:
    """The same GETs from the host straight to the server (no proxy)."""
    def get(path: str) -> None:
        with socket.create_connection((host.address, PORT)) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host.address}\r\n\r\n".encode())
            while s.recv(65536):
                pass

    for _ in range(20):
        get("/warm")
    took = []
    for i in range(n):
        began = time.perf_counter()
        get(f"/{i}")
        took.append((time.perf_counter() - began) * 1000)
    return took


async def proxied(gateway: Replgate, host: NetnsHost, policy: dict[str, Any],
                  n: int) -> dict[str, Any]:
    answer = await gateway.http.post("/v1/sessions", json={"profile": "open", "network": policy})
    answer.raise_for_status()
    sid = answer.json()["id"]
    try:
        result = await gateway.http_execute(sid, IN_SANDBOX.format(host=host.address, port=PORT,
                                                                   n=n))
        assert result["status"] == "ok", result
        through = summary(json.loads(result["stdout"]))
    finally:
        await gateway.delete_session(sid)
    straight = summary(await asyncio.to_thread(direct, host, n))
    return {"proxied_from_sandbox": through, "direct_from_host": straight,
            "cost_per_request_p50_ms": through["p50"] - straight["p50"]}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    policy_file = Path(tempfile.mkdtemp(prefix="rg-bench-net-", dir="/tmp")) / "policy.toml"
    policy_file.write_text(POLICY)
    Replgate.image = await asyncio.to_thread(sandbox_image, log)
    gateway = Replgate(min_idle=0, max_kernels=8,
                       settings={"REPLGATE_POLICY_FILE": str(policy_file)})
    try:
        with netns_host((PORT,)) as host:
            policy = {"default": "deny", "allow": [f"{host.address}:{PORT}"]}
            await gateway.wait_idle(2)
            log(f"{args.n} creates with a policy, {args.n} without, alternating")
            results = {"create": await creates(gateway, policy, args.n)}
            log(f"{args.requests} GETs through the proxy, and straight from the host")
            results["request"] = await proxied(gateway, host, policy, args.requests)
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
