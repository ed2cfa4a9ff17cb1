"""The MCP server: replgate's eight tools, for stdio and for the gateway's ``/mcp`` mount alike.

The tools are those of :class:`gateway.client.SandboxTools`, with the same descriptions and
arguments as for function calling. Which session a call runs on is the :data:`Resolver`'s
business: the stdio server has one session per process, the HTTP mount one per MCP session.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, ContentBlock, ImageContent, TextContent, ToolAnnotations
from opentelemetry import context as otel_context
from opentelemetry import propagate

from gateway import __version__
from gateway.client import ReplgateError, SandboxTools, TextPart, ToolLimits, ToolResult, tool_specs
from gateway.client._tool_specs import (
    Base64Flag,
    Code,
    CodeInLanguage,
    FileContent,
    FilePath,
    ForkCount,
    LanguageName,
    NotebookPath,
    ShellCommand,
    TimeoutS,
)
from gateway.client._tracecontext import W3C_FIELDS

Resolver = Callable[[Context], Awaitable[SandboxTools]]
"""Finds the tools (bound to a session) for the connection a tool call came on."""

INSTRUCTIONS = (
    "replgate gives you a persistent Python session in a sandbox, like a Jupyter notebook that "
    "you drive with execute_python: variables, imports and files persist between calls for "
    "this whole connection. execute_code runs other languages the sandbox offers (R, "
    "JavaScript/TypeScript, bash), each in a persistent session of its own, on the same "
    "files. Upload data with upload_file, inspect results with read_file and "
    "list_files, run shell commands with run_shell, and export the work as a notebook with "
    "export_notebook. The sandbox has no network unless its policy opens some: "
    "network_policy says what it may reach, and which requests get a secret.")


def to_call_result(result: ToolResult) -> CallToolResult:
    """A :class:`ToolResult` as MCP content: text blocks and image blocks, in order."""
    content: list[ContentBlock] = [
        TextContent(type="text", text=part.text) if isinstance(part, TextPart)
        else ImageContent(type="image", data=part.data, mime_type=part.media_type)
        for part in result.parts]
    return CallToolResult(content=content, is_error=result.is_error)


def trace_carrier(ctx: Context) -> dict[str, str]:
    """The caller's W3C trace context for a tool call: the request's ``_meta``
    (``traceparent``, ``tracestate``: OpenTelemetry's convention for MCP), else the HTTP
    request's headers; empty without one. The tool runs in the MCP session's task, not the
    HTTP request's, so the request's span is not current there."""
    try:
        request_context = ctx.request_context
    except ValueError:
        return {}
    meta = request_context.meta or {}
    carrier = {name: value for name in W3C_FIELDS
               if isinstance(value := meta.get(name), str)}
    headers = getattr(request_context.request, "headers", None)
    if not carrier and headers is not None:
        carrier = {name: headers[name] for name in W3C_FIELDS if name in headers}
    return carrier


def build_server(resolve: Resolver, limits: ToolLimits | None = None) -> MCPServer[Any]:
    """An MCP server whose tools run on the session ``resolve`` finds for each call."""
    server: MCPServer[Any] = MCPServer("replgate", instructions=INSTRUCTIONS,
                                       version=__version__, website_url=None)
    described = {spec.name: spec.description for spec in tool_specs(limits)}

    async def run(ctx: Context, call: Callable[[SandboxTools], Awaitable[ToolResult]]
                  ) -> CallToolResult:
        carrier = trace_carrier(ctx)
        # The caller's span as this task's current one: the gateway's spans (and the Python
        # client's traceparent, from the stdio server) continue its trace.
        token = otel_context.attach(propagate.extract(carrier)) if carrier else None
        try:
            tools = await resolve(ctx)
            result = await call(tools)
        except ReplgateError as exc:
            # The gateway failed or refused: tell the model in words it can act on.
            return CallToolResult(content=[TextContent(type="text", text=exc.message)],
                                  is_error=True)
        finally:
            if token is not None:
                otel_context.detach(token)
        return to_call_result(result)

    async def execute_python(code: Code, ctx: Context, timeout_s: TimeoutS = None
                             ) -> CallToolResult:
        return await run(ctx, lambda tools: tools.execute_python(code, timeout_s))

    async def execute_code(code: CodeInLanguage, language: LanguageName, ctx: Context,
                           timeout_s: TimeoutS = None) -> CallToolResult:
        return await run(ctx, lambda tools: tools.execute_code(code, language, timeout_s))

    async def upload_file(path: FilePath, content: FileContent, ctx: Context,
                          base64: Base64Flag = False) -> CallToolResult:
        return await run(ctx, lambda tools: tools.upload_file(path, content, base64))

    async def read_file(path: FilePath, ctx: Context, base64: Base64Flag = False
                        ) -> CallToolResult:
        return await run(ctx, lambda tools: tools.read_file(path, base64))

    async def list_files(ctx: Context) -> CallToolResult:
        return await run(ctx, lambda tools: tools.list_files())

    async def restart_kernel(ctx: Context) -> CallToolResult:
        return await run(ctx, lambda tools: tools.restart_kernel())

    async def export_notebook(ctx: Context, path: NotebookPath = None) -> CallToolResult:
        return await run(ctx, lambda tools: tools.export_notebook(path))

    async def run_shell(cmd: ShellCommand, ctx: Context, timeout_s: TimeoutS = None
                        ) -> CallToolResult:
        return await run(ctx, lambda tools: tools.run_shell(cmd, timeout_s))

    async def fork_session(ctx: Context, count: ForkCount = 1) -> CallToolResult:
        return await run(ctx, lambda tools: tools.fork_session(count))

    async def network_policy(ctx: Context) -> CallToolResult:
        return await run(ctx, lambda tools: tools.network_policy())

    hints: dict[Callable[..., Awaitable[CallToolResult]], ToolAnnotations] = {
        execute_python: ToolAnnotations(title="Run Python", destructive_hint=False,
                                        open_world_hint=False),
        execute_code: ToolAnnotations(title="Run code in another language",
                                      destructive_hint=False, open_world_hint=False),
        upload_file: ToolAnnotations(title="Upload a file", destructive_hint=True,
                                     idempotent_hint=True, open_world_hint=False),
        read_file: ToolAnnotations(title="Read a file", read_only_hint=True,
                                   open_world_hint=False),
        list_files: ToolAnnotations(title="List files", read_only_hint=True,
                                    open_world_hint=False),
        restart_kernel: ToolAnnotations(title="Restart the kernel", destructive_hint=True,
                                        idempotent_hint=True, open_world_hint=False),
        export_notebook: ToolAnnotations(title="Export as a notebook", destructive_hint=False,
                                         open_world_hint=False),
        run_shell: ToolAnnotations(title="Run a shell command", destructive_hint=True,
                                   open_world_hint=False),
        fork_session: ToolAnnotations(title="Fork the session", destructive_hint=False,
                                      open_world_hint=False),
        network_policy: ToolAnnotations(title="Show the session's network", read_only_hint=True,
                                        open_world_hint=False),
    }
    for function, hint in hints.items():
        name = function.__name__
        server.add_tool(function, name=name, description=described[name], annotations=hint,
                        structured_output=False)
    return server
