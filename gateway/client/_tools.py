"""replgate as tools for a model: a tool call turned into a result.

The same tools serve MCP (``replgate mcp``) and function calling; their arguments are
pydantic models and their descriptions are written for a model (both in ``_tool_specs``), and
:class:`SandboxTools` implements them once over :class:`ToolSession`, the few operations a
session offers.

    tools = sandbox.tools
    response = client.messages.create(..., tools=tools.anthropic())         # Anthropic
    results = await tools.anthropic_results(response.content)               # tool_result blocks
    response = client.chat.completions.create(..., tools=tools.openai())    # OpenAI
    messages += await tools.openai_messages(response.choices[0].message.tool_calls)
"""

from __future__ import annotations

import base64
import binascii
import builtins
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from pydantic import ValidationError

from gateway.wire import CommandResult, Execution, FileInfo
from kernel_pool import NetworkPolicy

from ._errors import InvalidRequestError, NotFoundError
from ._render import ImagePart, TextPart, ToolResult, cut, render_command, render_execution
from ._tool_specs import ToolLimits, ToolSpec, tool_specs


class ToolSession(Protocol):
    """What the tools need of a session: the client's sandbox and the gateway both offer it."""

    async def execute(self, code: str, timeout_s: float | None,
                      language: str | None = None) -> Execution:
        """Run code (in ``language``'s context; Python's by default); an exception in it is
        data, in the result."""
        ...

    async def write_file(self, path: str, data: bytes) -> int:
        """Write a file of the workspace; the size written."""
        ...

    async def read_file(self, path: str) -> bytes:
        """A file of the workspace; :class:`NotFoundError` when there is none."""
        ...

    async def list_files(self) -> list[FileInfo]:
        """Every file of the workspace."""
        ...

    async def restart(self) -> None:
        """A fresh kernel on the same workspace."""
        ...

    async def notebook(self) -> dict[str, Any]:
        """The session's history as an nbformat v4 notebook."""
        ...

    async def run_command(self, cmd: str, timeout_s: float | None) -> CommandResult:
        """Run a shell command beside the kernel; a non-zero exit is data."""

    async def fork(self, count: int) -> builtins.list[str]:
        """Copies of the session (variables and files); their ids."""
        ...

    async def network(self) -> NetworkPolicy:
        """The network policy the session's sandbox runs under."""
        ...


_IMAGE_SUFFIXES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}
_IMAGE_BYTES = 5 * 2**20


class SandboxTools:
    """The tools over one session, for a model's tool calls.

    :meth:`call` runs a call by name with its arguments (a dict, or the JSON text OpenAI
    sends) and returns a :class:`ToolResult`. A mistake of the model (an unknown tool, bad
    arguments, a missing file, a refused value) is a result with ``is_error``, for the model to
    read; a failure of the gateway itself raises :class:`ReplgateError`.
    """

    def __init__(self, session: ToolSession, limits: ToolLimits | None = None) -> None:
        self._session = session
        self.limits = limits or ToolLimits()
        self.specs = tool_specs(self.limits)
        """The tools' definitions, in order."""

    @property
    def names(self) -> list[str]:
        """The tools' names."""
        return [spec.name for spec in self.specs]

    def openai(self, names: Iterable[str] | None = None) -> builtins.list[dict[str, Any]]:
        """Tool definitions for OpenAI's ``tools=`` (all, or those ``names``)."""
        return [spec.openai() for spec in self._select(names)]

    def anthropic(self, names: Iterable[str] | None = None) -> builtins.list[dict[str, Any]]:
        """Tool definitions for Anthropic's ``tools=`` (all, or those ``names``)."""
        return [spec.anthropic() for spec in self._select(names)]

    def _select(self, names: Iterable[str] | None) -> builtins.list[ToolSpec]:
        if names is None:
            return list(self.specs)
        wanted = list(names)
        unknown = sorted(set(wanted) - set(self.names))
        if unknown:
            raise ValueError(f"unknown tools {unknown}; the tools are {self.names}")
        return [spec for spec in self.specs if spec.name in wanted]

    async def call(self, name: str, arguments: str | Mapping[str, Any] | None = None) -> ToolResult:
        """Run the tool ``name`` with ``arguments`` (dict or JSON text) for a model."""
        spec = next((spec for spec in self.specs if spec.name == name), None)
        if spec is None:
            return _error(f"There is no tool named {name!r}; the tools are "
                          f"{', '.join(self.names)}.")
        try:
            raw = json.loads(arguments) if isinstance(arguments, str | bytes) else arguments
            args = spec.arguments.model_validate(raw or {})
        except (ValueError, ValidationError) as exc:
            return _error(f"Invalid arguments for {name}: {_describe_invalid(exc)}")
        method = getattr(self, name)
        result: ToolResult = await method(**args.model_dump())
        return result

    async def execute_python(self, code: str, timeout_s: float | None = None) -> ToolResult:
        """Run ``code``; its output, result, error and images as parts."""
        try:
            execution = await self._session.execute(code, timeout_s)
        except InvalidRequestError as exc:
            return _error(f"The code was not run: {exc.message}")
        return render_execution(execution, max_chars=self.limits.text_chars)

    async def execute_code(self, code: str, language: str,
                           timeout_s: float | None = None) -> ToolResult:
        """Run ``code`` in ``language``'s context; its output, result, error and images."""
        try:
            execution = await self._session.execute(code, timeout_s, language)
        except InvalidRequestError as exc:
            return _error(f"The code was not run: {exc.message}")
        return render_execution(execution, max_chars=self.limits.text_chars)

    async def run_shell(self, cmd: str, timeout_s: float | None = None) -> ToolResult:
        """Run ``cmd``; its output and exit code as text."""
        try:
            result = await self._session.run_command(cmd, timeout_s)
        except InvalidRequestError as exc:
            return _error(f"The command was not run: {exc.message}")
        return render_command(result, max_chars=self.limits.text_chars)

    async def upload_file(self, path: str, content: str, base64: bool = False) -> ToolResult:
        """Write ``content`` (text, or base64) to ``path``."""
        if base64:
            try:
                data = _b64decode(content)
            except ValueError as exc:
                return _error(f"The content is not valid base64 ({exc}); send text with "
                              "base64=false, or encode the bytes with standard base64.")
        else:
            data = content.encode("utf-8", "surrogatepass")
        try:
            size = await self._session.write_file(path, data)
        except (InvalidRequestError, NotFoundError) as exc:
            return _error(f"Could not write {path!r}: {exc.message}")
        return ToolResult([TextPart(f"Wrote {size} bytes to {path}. The code sees it at that "
                                    "path, relative to its working directory.")])

    async def read_file(self, path: str, base64: bool = False) -> ToolResult:
        """The content of ``path``: text, an image, or base64."""
        try:
            data = await self._session.read_file(path)
        except NotFoundError:
            return _error(f"There is no file {path!r} in the working directory; list_files "
                          "shows the files there.")
        except InvalidRequestError as exc:
            return _error(f"Could not read {path!r}: {exc.message}")
        extra = {"data": data}
        media_type = _IMAGE_SUFFIXES.get(_suffix(path))
        if not base64 and media_type and len(data) <= _IMAGE_BYTES:
            return ToolResult([TextPart(f"{path}: {len(data)} bytes, {media_type}"),
                               ImagePart(_b64encode(data), media_type)], extra=extra)
        if not base64:
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                pass
            else:
                advice = "read the file in code to see the rest (slices, or a summary)"
                return ToolResult([TextPart(cut(text, self.limits.text_chars, advice))],
                                  extra=extra)
        encoded = _b64encode(data)
        if len(encoded) > self.limits.text_chars:
            return _error(f"{path} has {len(data)} bytes, too many to return as base64 (about "
                          f"{self.limits.text_chars * 3 // 4} at most): process it in code "
                          "instead.")
        what = "" if base64 else " (binary, not UTF-8 text)"
        return ToolResult([TextPart(f"{path}: {len(data)} bytes{what}, base64:\n{encoded}")],
                          extra=extra)

    async def list_files(self) -> ToolResult:
        """The workspace's files with their sizes."""
        files = sorted(await self._session.list_files(), key=lambda info: info.path)
        if not files:
            return ToolResult([TextPart("The working directory is empty.")])
        lines = [f"{info.path}\t{info.size} bytes" for info in files]
        return ToolResult([TextPart(f"{len(files)} file(s) in the working directory:\n"
                                    + "\n".join(lines))])

    async def restart_kernel(self) -> ToolResult:
        """Restart the kernel."""
        await self._session.restart()
        return ToolResult([TextPart(
            "The kernel was restarted: variables, imports and definitions are gone; files in "
            "the working directory are kept. Re-run imports before using them.")])

    async def fork_session(self, count: int = 1) -> ToolResult:
        """Copies of this session: their ids."""
        ids = await self._session.fork(count)
        listed = "\n".join(ids)
        return ToolResult([TextPart(
            f"Forked this session into {len(ids)} new session(s), each with this session's "
            f"variables and files; their ids:\n{listed}")], extra={"session_ids": ids})

    async def network_policy(self) -> ToolResult:
        """What the session's sandbox may reach."""
        policy = await self._session.network()
        if policy.default == "deny" and not policy.allow:
            text = ("This session has no network: every connection is refused (code that needs "
                    "data must work with files uploaded to the working directory).")
        else:
            opened = ("every host but those denied" if policy.default == "allow"
                      else "only the hosts allowed")
            text = (f"This session's network: {opened}, through an HTTP(S) proxy (its "
                    "HTTP_PROXY/HTTPS_PROXY variables; raw sockets have no route).\n"
                    f"allowed: {', '.join(policy.allow) or '-'}\n"
                    f"denied: {', '.join(policy.deny) or '-'}\n"
                    "An entry without a port means ports 80 and 443 when allowed, every port "
                    "when denied. Metadata, loopback and the host's own addresses are never "
                    "reachable.")
        if policy.rules:
            text += ("\nSecret rules (the egress proxy puts the tenant's secrets into matching "
                     "HTTPS requests; their values never enter the sandbox, so send requests "
                     "without the key, or with the {secret:NAME} placeholder where a rule "
                     "replaces it):")
            for rule in policy.rules:
                sets = ", ".join(f"{name}: {value}" for name, value in rule.headers.items())
                text += (f"\n- https://{rule.host}:{rule.port}, "
                         f"{'/'.join(rule.methods) or 'any method'}, "
                         f"{' '.join(rule.paths) or 'any path'}"
                         + (f": sets {sets}" if sets else "")
                         + (f"; replaces {', '.join(rule.secrets)}" if rule.secrets else ""))
        return ToolResult([TextPart(text)], extra={"network": policy.model_dump()})

    async def export_notebook(self, path: str | None = None) -> ToolResult:
        """The session's history as a notebook: returned, or saved at ``path``."""
        notebook = await self._session.notebook()
        cells = len(notebook.get("cells", []))
        text = json.dumps(notebook, indent=1)
        extra = {"notebook": notebook}
        if path is None:
            return ToolResult([TextPart(f"The session as a notebook ({cells} cells, "
                                        f"nbformat 4):\n{text}")], extra=extra)
        try:
            size = await self._session.write_file(path, text.encode())
        except (InvalidRequestError, NotFoundError) as exc:
            return _error(f"Could not write {path!r}: {exc.message}")
        return ToolResult([TextPart(f"Saved the session as a notebook ({cells} cells, {size} "
                                    f"bytes) to {path}.")], extra=extra)

    # -- whole responses -------------------------------------------------------------------

    async def anthropic_results(self, content: Sequence[Any]) -> builtins.list[dict[str, Any]]:
        """Run every ``tool_use`` block of an Anthropic response's ``content``.

        Blocks may be dicts or the SDK's objects. Returns the ``tool_result`` blocks, in order,
        for the next user message: ``{"role": "user", "content": results}``.
        """
        results = []
        for block in content:
            if _field(block, "type") == "tool_use":
                result = await self.call(_field(block, "name"), _field(block, "input"))
                results.append(result.to_anthropic(_field(block, "id")))
        return results

    async def openai_messages(self, tool_calls: Sequence[Any] | None
                              ) -> builtins.list[dict[str, Any]]:
        """Run an OpenAI assistant message's ``tool_calls``; the messages to append after it.

        Calls may be dicts or the SDK's objects. Each call gives a ``role: tool`` message; a
        call that made images is followed by a user message carrying them.
        """
        messages: list[dict[str, Any]] = []
        for tool_call in tool_calls or ():
            function = _field(tool_call, "function")
            result = await self.call(_field(function, "name"), _field(function, "arguments"))
            messages.extend(result.to_openai_messages(_field(tool_call, "id")))
        return messages

    def __repr__(self) -> str:
        return f"<SandboxTools {', '.join(self.names)}>"


def _error(text: str) -> ToolResult:
    return ToolResult([TextPart(text)], is_error=True)


def _describe_invalid(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(str(p) for p in error['loc']) or 'arguments'}: "
                         f"{error['msg']}" for error in exc.errors())
    return f"arguments are not a JSON object ({exc})"


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name)


def _suffix(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    return "." + name.rsplit(".", 1)[-1].lower() if "." in name else ""


def _b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _b64decode(text: str) -> bytes:
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except binascii.Error as exc:
        raise ValueError(str(exc)) from exc
