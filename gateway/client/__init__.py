"""The Python client of replgate: a persistent, sandboxed Python REPL for agents.

    from gateway.client import AsyncSandbox   # or Sandbox, the same without await

    async with await AsyncSandbox.create() as sbx:   # the gateway of this machine
        await sbx.run_code("x = 21")
        ex = await sbx.run_code("print(x * 2)", on_stdout=lambda e: print(e.text, end=""))
        assert ex.status == "ok" and ex.stdout == "42\\n"

``create()`` with no arguments finds the gateway of this machine as ``replgate mcp`` does
(:mod:`gateway.local`: ``REPLGATE_URL`` and ``REPLGATE_API_KEY``, else ``http://127.0.0.1:8000``
and the key ``replgate serve`` keeps in its state folder). Agents import it as ``replgate``
(``from replgate import Sandbox``). It needs only httpx, websockets and pydantic: its models
are the wire's (:mod:`gateway.wire`), the same the gateway serves.
"""

from gateway.wire import (
    CommandResult,
    CommandStatus,
    DisplayEvent,
    ErrorEvent,
    Execution,
    ExecutionError,
    ExecutionStatus,
    FileChange,
    FileInfo,
    FileWritten,
    Output,
    StreamEvent,
    TransferFrame,
)
from gateway.wire import SessionOut as SessionInfo

from ._async import AsyncSandbox, ToolSessionOf
from ._commands import AsyncCommandHandle, AsyncCommands
from ._errors import (
    AuthenticationError,
    InvalidRequestError,
    NotFoundError,
    RateLimitError,
    ReplgateError,
    ServerError,
    TransportError,
)
from ._files import AsyncFiles
from ._render import ImagePart, TextPart, ToolResult, render_execution
from ._sync import Sandbox
from ._tool_specs import ToolLimits, ToolSpec, tool_specs
from ._tools import SandboxTools, ToolSession

__all__ = [
    "AsyncCommandHandle",
    "AsyncCommands",
    "AsyncFiles",
    "AsyncSandbox",
    "AuthenticationError",
    "CommandResult",
    "CommandStatus",
    "DisplayEvent",
    "ErrorEvent",
    "Execution",
    "ExecutionError",
    "ExecutionStatus",
    "FileChange",
    "FileInfo",
    "FileWritten",
    "ImagePart",
    "InvalidRequestError",
    "NotFoundError",
    "Output",
    "RateLimitError",
    "ReplgateError",
    "Sandbox",
    "SandboxTools",
    "ServerError",
    "SessionInfo",
    "StreamEvent",
    "TextPart",
    "ToolLimits",
    "ToolResult",
    "ToolSession",
    "ToolSessionOf",
    "ToolSpec",
    "TransferFrame",
    "TransportError",
    "render_execution",
    "tool_specs",
]
