"""The MCP server over streamable HTTP at ``/mcp``, behind the gateway's Bearer auth.

Each request must carry a valid API key (401 otherwise); its tenant owns the MCP sessions it
opens, and another tenant's key sees them as absent (404). One MCP session (``Mcp-Session-Id``)
is one replgate session, started on the first tool call and deleted when the client ends the MCP
session (``DELETE /mcp``), when it has been idle for the gateway's idle TTL, or at shutdown.

Sessions exist only in the handshake era of MCP (up to protocol 2025-11-25); a request of the
stateless 2026-07-28 era is answered with ``UNSUPPORTED_PROTOCOL_VERSION`` naming the handshake
versions, on which MCP clients fall back to the handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import anyio
from mcp.server.mcpserver import Context
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import INVALID_REQUEST, UNSUPPORTED_PROTOCOL_VERSION
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.datastructures import Headers, QueryParams
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send

from gateway.auth import extract_token
from gateway.client import ReplgateError, SandboxTools, ToolLimits
from gateway.errors import DOMAIN_ERRORS, error_response

from ._server import build_server
from ._sessions import BackendFactory, LazySession

if TYPE_CHECKING:
    from gateway.service import Gateway

TENANT_KEY = "replgate.tenant"
"""Where the endpoint puts the caller's tenant in the ASGI scope for the tools."""

SESSION_HEADER = "mcp-session-id"
BackendsFor = Callable[["Gateway", str, str], BackendFactory]
"""How to start a session for a tenant on the gateway, of a profile (``/mcp?profile=``: one of
the gateway's, or a custom template's; default ``default``)."""


@dataclass
class _Connection:
    tenant: str
    session: LazySession
    tools: SandboxTools
    last_seen: float


class McpEndpoint:
    """The ASGI app at ``/mcp``: authentication, then the MCP SDK's session manager."""

    def __init__(self, backends: BackendsFor, *, limits: ToolLimits | None = None,
                 idle_ttl_s: float = 3600.0) -> None:
        self._backends = backends
        self._limits = limits
        self._idle_ttl_s = idle_ttl_s
        self._connections: dict[str, _Connection] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._build()

    def _build(self) -> None:
        self.server = build_server(self._resolve, self._limits)
        # The gateway checks the key on every request, so a page that DNS-rebinds to it gains
        # nothing: the SDK's Host/Origin allow-list (which would refuse a gateway serving on
        # another name) is off.
        self.server.streamable_http_app(
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            session_idle_timeout=self._idle_ttl_s)
        self._manager = self.server.session_manager

    @contextlib.asynccontextmanager
    async def run(self, languages: Sequence[str] | None = None) -> AsyncIterator[None]:
        """Serve while inside; on exit, end every MCP session and delete their sessions.

        ``languages``: those the sessions' image offers, which the tools' descriptions then
        name (known once the pool runs, after this endpoint was made).
        """
        if languages is not None:
            self._limits = replace(self._limits or ToolLimits(), languages=tuple(languages))
            self._build()
        async with self._manager.run():
            try:
                yield
            finally:
                with anyio.CancelScope(shield=True):
                    await self.aclose()

    async def aclose(self) -> None:
        """Delete every connection's replgate session."""
        connections, self._connections = list(self._connections.values()), {}
        await _close_all(connection.session for connection in connections)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    @property
    def connections(self) -> int:
        """MCP sessions open now."""
        return len(self._connections)

    # -- ASGI ------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # no WebSocket on /mcp: returning without accepting refuses it
        headers = Headers(scope=scope)
        gateway: Gateway = scope["app"].state.gateway
        try:
            tenant = await gateway.authenticate(extract_token(headers.get("authorization"), None))
        except DOMAIN_ERRORS as exc:
            response = error_response(exc)
            await response(scope, receive, send)
            return
        version = headers.get("mcp-protocol-version")
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            await _refuse_stateless(version, scope, receive, send)
            return
        session_id = headers.get(SESSION_HEADER)
        if session_id is not None:
            connection = self._connections.get(session_id)
            if connection is not None and connection.tenant != tenant:
                # Another tenant's MCP session looks exactly like a missing one.
                await _jsonrpc_error(None, INVALID_REQUEST, "Session not found", 404)(
                    scope, receive, send)
                return
            if connection is not None:
                connection.last_seen = time.monotonic()
        self._sweep()
        await self._forward({**scope, TENANT_KEY: tenant}, receive, send, gateway, tenant,
                            session_id)

    async def _forward(self, scope: Scope, receive: Receive, send: Send, gateway: Gateway,
                       tenant: str, session_id: str | None) -> None:
        status = 0

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                opened = Headers(raw=message.get("headers", [])).get(SESSION_HEADER)
                if session_id is None and opened and status < 400:
                    # Bound before the client can learn the id, so no call can outrun it.
                    profile = QueryParams(scope.get("query_string", b"")).get("profile")
                    self._bind(opened, tenant, gateway, profile or "default")
            await send(message)

        await self._manager.handle_request(scope, receive, watch)
        if session_id is not None and scope["method"] == "DELETE" and 200 <= status < 300:
            connection = self._connections.pop(session_id, None)
            if connection is not None:
                await connection.session.close()

    # -- connections -------------------------------------------------------------------------

    def _bind(self, session_id: str, tenant: str, gateway: Gateway,
              profile: str = "default") -> _Connection:
        session = LazySession(self._backends(gateway, tenant, profile))
        connection = _Connection(tenant=tenant, session=session,
                                 tools=SandboxTools(session, self._limits),
                                 last_seen=time.monotonic())
        self._connections[session_id] = connection
        return connection

    async def _resolve(self, ctx: Context) -> SandboxTools:
        request = ctx.request_context.request
        if not isinstance(request, Request):
            raise ReplgateError("replgate's /mcp tools need the HTTP request they came with.")
        tenant = request.scope.get(TENANT_KEY)
        session_id = request.headers.get(SESSION_HEADER)
        if not isinstance(tenant, str) or session_id is None:
            raise ReplgateError(
                "replgate keeps one Python session per MCP session: connect with a client that "
                "keeps the Mcp-Session-Id the server gives it (MCP protocol up to 2025-11-25).")
        connection = self._connections.get(session_id)
        if connection is None:
            connection = self._bind(session_id, tenant, request.app.state.gateway)
        elif connection.tenant != tenant:
            raise ReplgateError("Session not found.", status_code=404)
        return connection.tools

    def _sweep(self) -> None:
        """End connections idle past the TTL: the SDK has forgotten their MCP sessions too."""
        deadline = time.monotonic() - self._idle_ttl_s
        stale = [sid for sid, c in self._connections.items() if c.last_seen < deadline]
        if not stale:
            return
        sessions = [self._connections.pop(sid).session for sid in stale]
        task = asyncio.get_running_loop().create_task(_close_all(sessions))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def __repr__(self) -> str:
        started = sum(c.session.started for c in self._connections.values())
        return f"<McpEndpoint {len(self._connections)} connections, {started} with a session>"


async def _close_all(sessions: Iterable[LazySession]) -> None:
    for session in sessions:
        with contextlib.suppress(Exception):
            await session.close()


async def _refuse_stateless(version: str, scope: Scope, receive: Receive, send: Send) -> None:
    request = Request(scope, receive)
    try:
        request_id = json.loads(await request.body()).get("id")
    except (ValueError, AttributeError):
        request_id = None
    data = {"supported": list(HANDSHAKE_PROTOCOL_VERSIONS), "requested": version}
    message = ("Unsupported protocol version: replgate keeps one Python session per MCP "
               "session, so it speaks the MCP versions with sessions")
    await _jsonrpc_error(request_id, UNSUPPORTED_PROTOCOL_VERSION, message, 400, data)(
        scope, receive, send)


def _jsonrpc_error(request_id: Any, code: int, message: str, status: int,
                   data: Any = None) -> JSONResponse:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return JSONResponse({"jsonrpc": "2.0", "id": request_id, "error": error},
                        status_code=status)
