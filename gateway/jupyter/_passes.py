"""Passes onto a kernel's channels for a client that cannot send its key on the WebSocket.

jupyter_server's ``GatewayKernelClient`` (what nbclient, papermill and ``jupyter nbconvert
--execute`` use with ``GatewayKernelManager``) sends ``Authorization: token <key>`` on its HTTP
requests but opens ``/api/kernels/{id}/channels`` with no header, cookie or query value at all
(``websocket.create_connection(ws_url)`` in jupyter_server/gateway/managers.py), so the key it was
configured with (``JUPYTER_GATEWAY_AUTH_TOKEN``) never reaches the WebSocket.

An authenticated request for one kernel (``POST /api/kernels`` that starts it, ``GET`` or
``restart`` of it) leaves a pass: the next channels WebSocket to that kernel that presents no key
is let in as the request's tenant, once, if it comes from the same client address within
:data:`PASS_TTL_S`. The kernel id alone (which logs, traces and E2B hostnames carry) is never
enough. A WebSocket that presents a key is checked as before and leaves the pass alone.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import FastAPI
from starlette.requests import HTTPConnection

__all__ = ["PASS_TTL_S", "ChannelPasses", "channel_passes", "peer"]

PASS_TTL_S = 60.0
"""How long a pass waits for its WebSocket: jupyter_server's client opens it right after the
request that started or fetched the kernel (milliseconds later, seconds on a loaded machine)."""
MAX_PASSES = 4096
"""Passes kept at most, the oldest dropped first (a client that never connects leaves one)."""


@dataclass(frozen=True, slots=True)
class _Pass:
    tenant: str
    peer: str
    expires: float


class ChannelPasses:
    """Single-use passes onto kernels' channels, by kernel id (I/O-free, one event loop)."""

    def __init__(self, ttl_s: float = PASS_TTL_S, limit: int = MAX_PASSES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._limit = limit
        self._clock = clock
        self._passes: OrderedDict[str, _Pass] = OrderedDict()

    def __repr__(self) -> str:
        return f"<ChannelPasses: {len(self._passes)} waiting>"

    def grant(self, kernel_id: str, tenant: str, peer: str) -> None:
        """The tenant, calling from ``peer``, just proved its key on this kernel."""
        now = self._clock()
        while self._passes and next(iter(self._passes.values())).expires <= now:
            self._passes.popitem(last=False)  # granted in order, so they expire in order
        self._passes.pop(kernel_id, None)
        self._passes[kernel_id] = _Pass(tenant, peer, now + self._ttl_s)
        while len(self._passes) > self._limit:
            self._passes.popitem(last=False)

    def take(self, kernel_id: str, peer: str) -> str | None:
        """The tenant of the kernel's pass, used up, when ``peer`` is the client it was granted
        to and it has not expired; else None (a pass for another address stays)."""
        found = self._passes.get(kernel_id)
        if found is None or found.peer != peer:
            return None
        del self._passes[kernel_id]
        return found.tenant if self._clock() < found.expires else None

    def revoke(self, kernel_id: str) -> None:
        """The kernel is gone: its pass too."""
        self._passes.pop(kernel_id, None)


def channel_passes(app: FastAPI) -> ChannelPasses:
    """The app's passes (made on first use)."""
    passes: ChannelPasses | None = getattr(app.state, "jupyter_channel_passes", None)
    if passes is None:
        passes = app.state.jupyter_channel_passes = ChannelPasses()
    return passes


def peer(connection: HTTPConnection) -> str:
    """The client's address as uvicorn gives it: behind a proxy, the proxy's, or the forwarded
    one when uvicorn trusts the proxy (``FORWARDED_ALLOW_IPS``; 127.0.0.1 by default)."""
    return connection.client.host if connection.client else ""
