"""E2B's host names, for the SDK releases that know no other way here (``e2b`` 2.0 to 2.6).

Those releases reach the API at ``https://api.E2B_DOMAIN`` and a sandbox's port at
``https://PORT-ID.DOMAIN``, ``DOMAIN`` being the create answer's ``domain`` (else
``E2B_DOMAIN``). With ``REPLGATE_E2B_DOMAIN`` set, a request whose Host is ``api.DOMAIN`` is
served as ``/e2b/<path>``, and one whose Host is ``PORT-ID.DOMAIN`` as
``/e2b/sandbox/<path>`` with the ``E2b-Sandbox-Id`` and ``E2b-Sandbox-Port`` headers the
newer SDKs send (:mod:`._access`). Other hosts pass untouched; TLS and the wildcard DNS record
are the deployment's (docs/e2b.md, "SDK releases").
"""

from __future__ import annotations

import json
import re

from starlette.types import ASGIApp, Receive, Scope, Send

_PORT_ID = re.compile(r"(\d{1,5})-([A-Za-z0-9][A-Za-z0-9-]*)")
"""The first label of a sandbox's host: ``49983-<sandbox id>`` (an id is one DNS label)."""


class E2BHosts:
    """Pure ASGI middleware: E2B's host names under ``domain`` as the ``/e2b`` routes."""

    def __init__(self, app: ASGIApp, domain: str) -> None:
        self.app = app
        self.domain = domain.strip(".").lower()
        self._suffix = "." + self.domain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = _host(scope)
        if host != self.domain and not host.endswith(self._suffix):
            await self.app(scope, receive, send)
            return
        label = host[:-len(self._suffix)] if host != self.domain else ""
        if label == "api":
            await self.app(_under(scope, "/e2b"), receive, send)
            return
        match = _PORT_ID.fullmatch(label)
        if match is None:
            await _not_found(scope, send, f"{host} is neither api.{self.domain} nor "
                             f"PORT-SANDBOXID.{self.domain}: replgate answers E2B's SDKs there")
            return
        port, sandbox_id = match.groups()
        scope = _under(scope, "/e2b/sandbox")
        # The host names the sandbox: headers saying otherwise would reach another one.
        scope["headers"] = [(k, v) for k, v in scope["headers"]
                            if k not in (b"e2b-sandbox-id", b"e2b-sandbox-port")]
        scope["headers"] += [(b"e2b-sandbox-id", sandbox_id.encode()),
                             (b"e2b-sandbox-port", port.encode())]
        await self.app(scope, receive, send)


def _host(scope: Scope) -> str:
    for name, value in scope["headers"]:
        if name == b"host":
            host: str = value.decode("latin-1").lower()
            return host.rsplit(":", 1)[0] if not host.endswith("]") else host
    return ""


def _under(scope: Scope, prefix: str) -> Scope:
    raw_path = scope.get("raw_path") or scope["path"].encode()
    return {**scope, "path": prefix + scope["path"], "raw_path": prefix.encode() + raw_path}


async def _not_found(scope: Scope, send: Send, message: str) -> None:
    """E2B's error shape, as its proxy answers a host it has no sandbox for."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 4404, "reason": message[:120]})
        return
    body = json.dumps({"code": 404, "message": message}).encode()
    await send({"type": "http.response.start", "status": 404,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
