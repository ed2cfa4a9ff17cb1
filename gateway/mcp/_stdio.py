"""``replgate mcp``: the MCP server over stdio, its one session on a running gateway.

The process is one MCP connection, so it holds one replgate session: started on the first tool
call through the Python client (``REPLGATE_URL``, ``REPLGATE_API_KEY``), and deleted when the
client closes stdin or stops the process with SIGTERM/SIGINT. A process killed outright leaves
its session to the gateway, which deletes it after ``REPLGATE_IDLE_TTL_S`` idle. The tools name
the languages the gateway's default profile offers, read from its kernelspecs as the process
starts.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import replace
from typing import Any

import anyio
from mcp.server.mcpserver import Context

from gateway.client import ReplgateError, SandboxTools, ToolLimits
from gateway.client._transport import Transport

from ._server import build_server
from ._sessions import ClientBackend, LazySession

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 10.0


async def run_stdio(*, base_url: str | None = None, api_key: str | None = None,
                    limits: ToolLimits | None = None) -> None:
    """Serve MCP on stdin/stdout until the client goes; then delete the session."""
    languages = await offered_languages(base_url, api_key)
    if languages is not None:
        limits = replace(limits or ToolLimits(), languages=languages)
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


async def offered_languages(base_url: str | None, api_key: str | None,
                            profile: str = "default") -> tuple[str, ...] | None:
    """The languages ``profile``'s sessions offer, from the gateway's Jupyter kernelspecs (one
    per language of its image); None when the gateway cannot tell (the tools then say the
    image decides)."""
    try:
        transport = Transport(base_url, api_key)
    except ReplgateError:
        return None
    try:
        specs: dict[str, Any] = (await transport.request("GET", "/api/kernelspecs")
                                 ).json()["kernelspecs"]
        named = [spec["spec"]["metadata"]["replgate"] for spec in specs.values()]
        languages = [str(item["language"]) for item in named if item.get("profile") == profile]
    except (ReplgateError, ValueError, KeyError, TypeError) as exc:
        logger.info("the gateway's languages are unknown (%s): the tools name them all", exc)
        return None
    finally:
        await transport.aclose()
    if "javascript" in languages:
        languages.append("typescript")  # Deno's kernel runs both
    # Python's alone tells nothing: a gateway of nodes lists no other before a session exists.
    return tuple(languages) if len(languages) > 1 else None
