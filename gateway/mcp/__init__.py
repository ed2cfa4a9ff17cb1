"""replgate as an MCP server: a persistent, sandboxed Python session as tools for a model.

- ``replgate mcp`` (:func:`run_stdio`): over stdio, one session per process, on a running
  gateway reached with the Python client.
- ``/mcp`` on the gateway (:mod:`gateway.mcp.service`): over streamable HTTP with the gateway's
  API keys, one session per MCP session, on the in-process service.

Both serve :func:`build_server`'s tools, which are :class:`gateway.client.SandboxTools` run on
a :class:`LazySession`: one set of tool implementations over the small
:class:`gateway.client.ToolSession` protocol, whichever way the session is reached.
"""

from ._server import INSTRUCTIONS, Resolver, build_server, to_call_result
from ._sessions import Backend, BackendFactory, ClientBackend, LazySession, SessionExpired
from ._stdio import run_stdio

__all__ = [
    "INSTRUCTIONS",
    "Backend",
    "BackendFactory",
    "ClientBackend",
    "LazySession",
    "Resolver",
    "SessionExpired",
    "build_server",
    "run_stdio",
    "to_call_result",
]
