"""The tools' definitions: their arguments (pydantic models), their descriptions for a model,
and their JSON schemas for MCP and function calling (:func:`tool_specs`).

:class:`gateway.client.SandboxTools` runs them; ``replgate mcp`` lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from ._render import DEFAULT_TEXT_CHARS

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


class NetworkPolicyArgs(_Arguments):
    pass


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
    """The tools, described with ``limits``."""
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
        ToolSpec("network_policy", (
            "Show what this session's sandbox may reach on the network: nothing (the "
            "default), or the hosts its network policy allows or denies, reached through an "
            "HTTP(S) proxy. Read it before code that downloads, installs packages or calls "
            "an API."), NetworkPolicyArgs),
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
