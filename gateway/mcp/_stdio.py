"""``replgate mcp``: the MCP server over stdio, its one session on a running gateway.

The process is one MCP connection, so it holds one replgate session: started on the first tool
call through the Python client (``REPLGATE_URL``, ``REPLGATE_API_KEY``), and deleted when the
client closes stdin or stops the process with SIGTERM/SIGINT. A process killed outright leaves
its session to the gateway, which deletes it after ``REPLGATE_IDLE_TTL_S`` idle.
"""

from __future__ import annotations

import logging
import signal

import anyio
from mcp.server.mcpserver import Context

from gateway.client import SandboxTools, ToolLimits

from ._server import build_server
from ._sessions import ClientBackend, LazySession

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 10.0


async def run_stdio(*, base_url: str | None = None, api_key: str | None = None,
                    limits: ToolLimits | None = None) -> None:
    """Serve MCP on stdin/stdout until the client goes; then delete the session."""
    session = LazySession(ClientBackend.factory(base_url, api_key))
    tools = SandboxTools(session, limits)

    async def resolve(ctx: Context) -> SandboxTools:
        return tools

    server = build_server(resolve, limits)
    try:
        async with anyio.create_task_group() as group:

            async def stop_on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT,
                                                signal.SIGHUP) as signals:
                    async for _ in signals:
                        group.cancel_scope.cancel()
                        return

            group.start_soon(stop_on_signal)
            await server.run_stdio_async()
            group.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT_S):
            try:
                await session.close()
            except Exception as exc:  # the gateway may be gone; its idle TTL then cleans up
                logger.warning("could not delete the replgate session: %s", exc)
