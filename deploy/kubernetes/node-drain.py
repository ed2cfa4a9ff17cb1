"""preStop of a replgate node pod: drain this node through a gateway, and wait until it is empty.

Usage: ``node-drain.py GATEWAY_URL PORT DEADLINE_S``. This node is the one ``GET /v1/nodes``
lists at ``$POD_IP:PORT``, the address it advertises; the first of ``REPLGATE_ADMIN_KEYS``
authorizes. ``POST /v1/nodes/{id}/drain`` pauses each of its sessions into the bundle store;
they are gone from the node when its ``sessions`` count is 0. Standard library only: it runs in
the node's container with the image's Python, whatever replgate's own packages are.

A failure exits 1 with the reason, which Kubernetes records as the pod's FailedPreStopHook
event; the node is stopped anyway, and its sessions resume elsewhere once its heartbeat times
out (``REPLGATE_NODE_TIMEOUT_S``), from their last pause.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

POLL_S = 2.0
REQUEST_TIMEOUT_S = 10.0


def call(method: str, url: str, key: str) -> Any:
    request = urllib.request.Request(url, method=method,
                                     headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as answer:
        return json.load(answer)


def this_node(gateway: str, key: str, address: str) -> dict[str, Any] | None:
    nodes = call("GET", f"{gateway}/v1/nodes", key)
    return next((node for node in nodes if node.get("address") == address), None)


def drain(gateway: str, port: str, deadline_s: float) -> str:
    """Drain the node and wait; the sentence to log. Raises on what stops it."""
    key = os.environ["REPLGATE_ADMIN_KEYS"].split(",")[0].strip()
    pod_ip = os.environ["POD_IP"]
    address = f"[{pod_ip}]:{port}" if ":" in pod_ip else f"{pod_ip}:{port}"
    node = this_node(gateway, key, address)
    if node is None:
        return f"no node registered at {address}: nothing to drain"
    call("POST", f"{gateway}/v1/nodes/{node['id']}/drain", key)
    deadline = time.monotonic() + deadline_s
    while node is not None and node.get("sessions", 0) > 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"node {node['id']} still holds {node['sessions']} sessions "
                               f"after {deadline_s:.0f} s of draining")
        time.sleep(POLL_S)
        node = this_node(gateway, key, address)
    return f"node at {address} drained"


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    gateway, port, deadline_s = argv[1].rstrip("/"), argv[2], float(argv[3])
    try:
        print(f"replgate node drain: {drain(gateway, port, deadline_s)}", file=sys.stderr)
    except (OSError, KeyError, ValueError, urllib.error.URLError) as exc:
        print(f"replgate node drain failed: {exc!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
