"""replgate as tools for a model: their definitions, and a tool call turned into a result.

The same eight tools serve MCP (``replgate mcp``) and function calling; their arguments are the
pydantic models below, their descriptions are written for a model, and :class:`SandboxTools`
implements them once over :class:`ToolSession`, the few operations a session offers.

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
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.wire import CommandResult, Execution, FileInfo

from ._errors import InvalidRequestError, NotFoundError
from ._render import (
    DEFAULT_TEXT_CHARS,
    ImagePart,
    TextPart,
    ToolResult,
    cut,
    render_command,
    render_execution,
)

# -- arguments -------------------------------------------------------------------------------

Code = Annotated[str, Field(description=(
    "Python code to run, like a notebook cell: statements, then optionally an expression "
    "whose value is shown."))]
TimeoutS = Annotated[float | None, Field(gt=0, description=(
    "Time limit for this call in seconds; omit for the default. Use a larger one only for "
    "work known to be slow."))]
FilePath = Annotated[str, Field(min_length=1, description=(
    "Path relative to the working directory, e.g. 'data/sales.csv'. Folders are created."))]
Base64Flag = Annotated[bool, Field(description=(
    "True when the content is (or should be returned as) base64, for binary files."))]
FileContent = Annotated[str, Field(description=(
    "The file's content: text (written as UTF-8), or base64 when base64 is true."))]
ShellCommand = Annotated[str, Field(min_length=1, description=(
    "A shell command, run as `sh -c cmd` in the working directory, e.g. 'ls -la data' or "
    "'wc -l data/sales.csv'."))]
CodeInLanguage = Annotated[str, Field(description=(
    "Code in the language named by language, like a notebook cell: statements, then "
    "optionally an expression whose value is shown."))]
LanguageName = Annotated[str, Field(min_length=1, max_length=32, description=(
    "The language of the code: 'r', 'javascript', 'typescript', 'java', 'bash' or 'python' "
    "(as execute_python); the sandbox must offer it (see the tool's description)."))]
NotebookPath = Annotated[str | None, Field(min_length=1, description=(
    "Save the notebook at this path in the working directory (e.g. 'analysis.ipynb') instead "
    "of returning its JSON."))]


class _Arguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ExecutePythonArgs(_Arguments):
    code: Code
    timeout_s: TimeoutS = None


class ExecuteCodeArgs(_Arguments):
    code: CodeInLanguage
    language: LanguageName
    timeout_s: TimeoutS = None


class UploadFileArgs(_Arguments):
    path: FilePath
    content: FileContent
    base64: Base64Flag = False


class ReadFileArgs(_Arguments):
    path: FilePath
    base64: Base64Flag = False


class ListFilesArgs(_Arguments):
    pass


class RestartKernelArgs(_Arguments):
    pass


class ExportNotebookArgs(_Arguments):
    path: NotebookPath = None


class RunShellArgs(_Arguments):
    cmd: ShellCommand
    timeout_s: TimeoutS = None


ForkCount = Annotated[int, Field(ge=1, le=16, description=(
    "How many copies to make (1 to 16)."))]


class ForkSessionArgs(_Arguments):
    count: ForkCount = 1


# -- descriptions ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolLimits:
    """The limits the descriptions state (the gateway's defaults unless told otherwise)."""

    default_timeout_s: float = 60.0
    max_timeout_s: float = 3600.0
    output_chars: int = 20_000
    """stdout+stderr characters the gateway returns per execution (REPLGATE_STREAM_CHARS)."""
    text_chars: int = DEFAULT_TEXT_CHARS
    """Characters of one result, display or file returned whole to the model."""
    languages: tuple[str, ...] | None = None
    """The languages the sandbox offers (``python``, ``bash``, ``r``, ...), when known."""


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its name, its description for a model, and its arguments' model."""

    name: str
    description: str
    arguments: type[BaseModel]

    def parameters(self) -> dict[str, Any]:
        """The arguments as JSON Schema (an object; optional ones are not required)."""
        return _clean_schema(self.arguments.model_json_schema())

    def openai(self) -> dict[str, Any]:
        """The tool in OpenAI's function-calling shape."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": self.parameters()}}

    def anthropic(self) -> dict[str, Any]:
        """The tool in Anthropic's tool-use shape."""
        return {"name": self.name, "description": self.description,
                "input_schema": self.parameters()}


LANGUAGE_NOTES = {
    "python": "'python' (the same session as execute_python)",
    "r": ("'r' (R: print() or a last expression shows values; plot() and ggplot charts come "
          "back as PNG images; library() loads the packages installed, nothing can be installed)"),
    "javascript": ("'javascript' (Deno: console.log prints, the last expression's value is "
                   "shown, top-level await works)"),
    "typescript": "'typescript' (the same Deno session as 'javascript', with types)",
    "java": ("'java' (JShell: statements, declarations and expressions without a class around "
             "them; System.out.println prints, the last expression's value is shown)"),
    "bash": ("'bash' (a persistent shell: variables and the current directory stay; a "
             "command exiting non-zero is an error)"),
}


def _languages_text(languages: tuple[str, ...] | None) -> str:
    if languages is None:
        return ("Languages: " + ", ".join(LANGUAGE_NOTES.values()) + ". Which of them this "
                "sandbox has depends on its image (the default image: all of them; the slim "
                "one: python and bash); asking for one it lacks returns an error naming those "
                "it has.")
    known = [LANGUAGE_NOTES[name] for name in languages if name in LANGUAGE_NOTES]
    return ("This sandbox offers: " + ", ".join(known) + ". No other language can be run "
            "here.")


def tool_specs(limits: ToolLimits | None = None) -> list[ToolSpec]:
    """The eight tools, described with ``limits``."""
    lim = limits or ToolLimits()
    execute = (
        "Run Python code in a persistent, sandboxed Python (IPython) session and get back what "
        "it printed, the value of its last expression, the error traceback if it failed, and "
        "charts as PNG images.\n\n"
        "What persists: variables, functions, imports and loaded data stay between calls, as "
        "in a notebook; files written to the working directory stay too (and survive "
        "restart_kernel). Available: numpy, pandas, scipy, scikit-learn, statsmodels, "
        "matplotlib, seaborn, sympy, networkx, pyarrow, openpyxl, pillow and the standard "
        "library; nothing else can be installed.\n\n"
        f"Limits: each call may run {lim.default_timeout_s:g} s by default (timeout_s up to "
        f"{lim.max_timeout_s:g} s); past it the code is interrupted, and if it does not stop the "
        "kernel restarts and variables are lost. Output is capped at about "
        f"{lim.output_chars} characters: beyond that only the head and tail are returned and "
        "the full text is saved to a file whose name is in the truncation notice. There is no "
        "network (no pip install, no downloads) and no stdin (input() fails at once).\n\n"
        "Advice: print summaries, not whole datasets (df.head(), df.shape, df.describe(), "
        "len(x)); save big results to files and read back what you need; show a chart with "
        "plt.show(). When a call fails, read the traceback, fix the code and run again: what "
        "was defined before is still there. Load files given with upload_file by their path.")
    execute_code = (
        "Run code in another language than Python in this same sandbox, and get back what it "
        "printed, the value of its last expression, the error if it failed, and charts as "
        "PNG images. " + _languages_text(lim.languages) + "\n\n"
        "Each language has its own persistent session, like a notebook of its own: its "
        "variables and definitions stay between calls in that language, apart from "
        "Python's. All languages share the working directory's files: pass data between "
        "them through files (write a CSV in Python, read it in R). The first call in a "
        "language starts its interpreter (a second or so).\n\n"
        f"Limits as for execute_python: {lim.default_timeout_s:g} s per call by default "
        f"(timeout_s up to {lim.max_timeout_s:g} s; past it the code is interrupted, and if "
        "it does not stop that language's session restarts and its variables are lost), "
        f"output capped at about {lim.output_chars} characters, no network, no stdin, "
        "nothing can be installed. Print summaries rather than whole datasets.")
    return [
        ToolSpec("execute_python", execute, ExecutePythonArgs),
        ToolSpec("execute_code", execute_code, ExecuteCodeArgs),
        ToolSpec("upload_file", (
            "Write a file into the Python session's working directory (replacing any file of "
            "that name), for the code run by execute_python to read, e.g. "
            "pd.read_csv('data/sales.csv'). Content is text, or base64 with base64=true for "
            "binary files. Files persist for the whole session, across restart_kernel."),
         UploadFileArgs),
        ToolSpec("read_file", (
            "Read a file from the Python session's working directory: text is returned as "
            "text, PNG/JPEG images as images, other binary files as base64 (or any file as "
            "base64 with base64=true). Texts longer than about "
            f"{lim.text_chars} characters are cut to their head and tail: read big files in "
            "code instead (print parts, or summarise)."), ReadFileArgs),
        ToolSpec("list_files", (
            "List every file in the Python session's working directory, recursively, with its "
            "size in bytes. Paths are relative to the working directory, as the code sees "
            "them. Truncated outputs are kept under .replgate/outputs/."), ListFilesArgs),
        ToolSpec("restart_kernel", (
            "Restart the Python session's kernel: all variables, imports and definitions are "
            "lost, files in the working directory are kept. Use it when the state is broken "
            "or memory is exhausted; re-run imports afterwards."), RestartKernelArgs),
        ToolSpec("export_notebook", (
            "Export every execution of this session so far, in order and with its outputs, "
            "as a Jupyter notebook (nbformat 4 JSON). With path, the notebook is saved in the "
            "working directory instead of being returned."), ExportNotebookArgs),
        ToolSpec("run_shell", (
            "Run a shell command (sh -c) in the Python session's sandbox, in its working "
            "directory, beside the Python kernel: e.g. ls -la, wc -l data.csv, head file.txt, "
            "pip list. Returns stdout, stderr and the exit code (a non-zero exit code is a "
            "result, not a failure of the tool). Same limits as execute_python: no network, "
            f"the same time limit ({lim.default_timeout_s:g} s by default), output capped at "
            f"about {lim.output_chars} characters. Background processes it starts are killed "
            "when it ends."), RunShellArgs),
        ToolSpec("fork_session", (
            "Copy this Python session: each copy starts with the same variables (random "
            "generators reseeded, so copies draw different numbers) and a copy of the working "
            "directory's files, and this session goes on unchanged. Returns the new sessions' "
            "ids, to drive through replgate's HTTP API or client (this connection stays on "
            "this session). Threads and open connections are not copied."), ForkSessionArgs),
    ]


def _clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Pydantic's schema without titles, and ``X | None = None`` as a plain optional ``X``."""
    properties: dict[str, Any] = {}
    for name, prop in schema.get("properties", {}).items():
        prop = {key: value for key, value in prop.items() if key != "title"}
        options = prop.pop("anyOf", None)
        if options is not None:
            kept = [option for option in options if option.get("type") != "null"]
            if len(kept) == 1:
                prop = {**kept[0], **prop}
            else:
                prop["anyOf"] = options
        if prop.get("default", ...) is None:
            del prop["default"]
        properties[name] = prop
    cleaned: dict[str, Any] = {"type": "object", "properties": properties,
                               "additionalProperties": False}
    if schema.get("required"):
        cleaned["required"] = list(schema["required"])
    return cleaned


# -- implementation --------------------------------------------------------------------------


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


_IMAGE_SUFFIXES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}
_IMAGE_BYTES = 5 * 2**20


class SandboxTools:
    """The eight tools over one session, for a model's tool calls.

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

