"""What a model sees of an execution: text parts and images, the same for MCP and function calling.

An :class:`Execution` becomes a :class:`ToolResult`: stdout as printed, stderr, the cell's
result and displays as text, PNG/JPEG displays as images with their chart's data as compact
JSON, the traceback's short form (``error.short``: the frames of the user's own code and the
exception line, and a sentence when the code met the missing network), the files the code
touched, and a closing note whenever the status is not ``ok`` or the output was cut, saying
what happened and what survived. Long texts keep their head and tail.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from gateway.wire import CommandResult, CommandStatus, Execution, ExecutionStatus, FileChange

DEFAULT_TEXT_CHARS = 20_000
"""Characters of one text (a result, a display, a file) returned to a model."""

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
_IMAGE_TYPES = ("image/png", "image/jpeg")
CHART_CHARS = 4_000
"""Characters of a chart's data shown to a model (the image is beside it)."""
FILES_SHOWN = 50


@dataclass(frozen=True)
class TextPart:
    """Text for the model."""

    text: str


@dataclass(frozen=True)
class ImagePart:
    """An image for the model: base64 ``data`` of ``media_type``."""

    data: str
    media_type: str = "image/png"


Part = TextPart | ImagePart


@dataclass
class ToolResult:
    """What a tool call gives back: parts in order, and whether it failed.

    ``is_error`` is true when the tool could not do what was asked, and for an execution whose
    status is not ``ok`` (an exception, a timeout, a crash): the model should look and fix.
    ``execution`` is the underlying :class:`Execution` for ``execute_python``.
    """

    parts: list[Part]
    is_error: bool = False
    execution: Execution | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Tool-specific data for a program (not shown to the model): ``notebook`` for
    ``export_notebook``, ``data`` (bytes) for ``read_file``."""

    @property
    def text(self) -> str:
        """The text parts, joined by newlines."""
        return "\n".join(part.text for part in self.parts if isinstance(part, TextPart))

    @property
    def images(self) -> list[ImagePart]:
        """The image parts, in order."""
        return [part for part in self.parts if isinstance(part, ImagePart)]

    def to_anthropic(self, tool_use_id: str) -> dict[str, Any]:
        """A ``tool_result`` content block for Anthropic's Messages API (text and image blocks)."""
        content: list[dict[str, Any]] = []
        for part in self.parts:
            if isinstance(part, TextPart):
                content.append({"type": "text", "text": part.text})
            else:
                content.append({"type": "image", "source": {
                    "type": "base64", "media_type": part.media_type, "data": part.data}})
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id,
                                 "content": content}
        if self.is_error:
            block["is_error"] = True
        return block

    def to_openai(self, tool_call_id: str) -> dict[str, Any]:
        """The ``role: tool`` message for OpenAI's Chat Completions API (text only).

        Chat Completions takes images only in user messages: :meth:`to_openai_messages` adds
        one carrying them.
        """
        text = self.text
        if self.images:
            text += f"\n[{len(self.images)} image(s) attached in the next message]"
        return {"role": "tool", "tool_call_id": tool_call_id, "content": text}

    def to_openai_messages(self, tool_call_id: str) -> list[dict[str, Any]]:
        """The tool message, then (when there are images) a user message with them as parts."""
        messages = [self.to_openai(tool_call_id)]
        if self.images:
            parts: list[dict[str, Any]] = [
                {"type": "text", "text": f"Images produced by tool call {tool_call_id}:"}]
            parts.extend({"type": "image_url", "image_url": {
                "url": f"data:{image.media_type};base64,{image.data}"}} for image in self.images)
            messages.append({"role": "user", "content": parts})
        return messages


def strip_ansi(text: str) -> str:
    """``text`` without terminal escape sequences (IPython colours its tracebacks)."""
    return _ANSI.sub("", text)


def cut(text: str, limit: int, advice: str) -> str:
    """``text`` if it fits ``limit`` characters, else its head and tail around a notice."""
    if len(text) <= limit:
        return text
    half = max(limit // 2, 1)
    dropped = len(text) - 2 * half
    return (f"{text[:half]}\n[... {dropped} characters cut of {len(text)}; {advice}]\n"
            f"{text[-half:]}")


_RESULT_ADVICE = ("the value is too long to show whole: print a summary (len(x), x[:20], "
                  "df.head()), or write it to a file and read parts of it")


def render_execution(execution: Execution, *,
                     max_chars: int = DEFAULT_TEXT_CHARS) -> ToolResult:
    """The parts a model should see of ``execution``; ``is_error`` unless its status is ok."""
    parts: list[Part] = []
    if execution.stdout:
        parts.append(TextPart(cut(execution.stdout, max_chars, _RESULT_ADVICE)))
    if execution.stderr:
        parts.append(TextPart("[stderr]\n" + cut(execution.stderr, max_chars, _RESULT_ADVICE)))
    for output in execution.outputs:
        image = next((kind for kind in _IMAGE_TYPES if isinstance(output.data.get(kind), str)),
                     None)
        if image is not None:
            parts.append(ImagePart(data=output.data[image].strip(), media_type=image))
            if output.chart is not None:
                data = json.dumps(output.chart, separators=(",", ":"))
                parts.append(TextPart(f"[chart data]\n{cut(data, CHART_CHARS, _CHART_ADVICE)}"))
            continue
        text = output.data.get("text/plain")
        if isinstance(text, str):
            label = (f"[result Out[{execution.execution_count}]]"
                     if output.type == "result" and execution.execution_count
                     else f"[{output.type}]")
            parts.append(TextPart(f"{label}\n{cut(strip_ansi(text), max_chars, _RESULT_ADVICE)}"))
    if execution.error is not None:
        error = execution.error
        trace = (error.short or error.text or strip_ansi(error.traceback)).strip()
        if not trace:
            trace = f"{error.ename}: {error.evalue}"
        parts.append(TextPart("[error]\n" + cut(trace, max_chars, _RESULT_ADVICE)))
    if execution.files:
        parts.append(TextPart(describe_files(execution.files)))
    note = _status_note(execution)
    if note:
        parts.append(TextPart(note))
    if not parts:
        parts.append(TextPart("[ok: the code ran and printed nothing]"))
    return ToolResult(parts=parts, is_error=execution.status is not ExecutionStatus.OK,
                      execution=execution)


def render_command(result: CommandResult, *,
                   max_chars: int = DEFAULT_TEXT_CHARS) -> ToolResult:
    """What a model should see of a shell command; ``is_error`` only if it did not run to
    its end (a non-zero exit code is a result to read)."""
    parts: list[Part] = []
    if result.stdout:
        parts.append(TextPart(cut(result.stdout, max_chars, _RESULT_ADVICE)))
    if result.stderr:
        parts.append(TextPart("[stderr]\n" + cut(result.stderr, max_chars, _RESULT_ADVICE)))
    if result.status is CommandStatus.OK:
        parts.append(TextPart(f"[exit code {result.exit_code}]"))
    else:
        parts.append(TextPart(f"[status: {result.status.value}] {result.reason or ''}".strip()))
    if result.truncated:
        parts.append(TextPart("[truncated] The output was longer than the cap: only its head "
                              "and tail are shown; the full text is in the file named above."))
    return ToolResult(parts=parts, is_error=result.status is not CommandStatus.OK)


_CHART_ADVICE = "the chart has more data than shown: read the numbers from the data in code"


def describe_files(files: list[FileChange]) -> str:
    """One line per file the code touched (the first :data:`FILES_SHOWN`)."""
    lines = [f"{f.change} {f.path}" + (f" ({f.size} bytes)" if f.size is not None else "")
             for f in files[:FILES_SHOWN]]
    if len(files) > FILES_SHOWN:
        lines.append(f"... and {len(files) - FILES_SHOWN} more")
    return "[files]\n" + "\n".join(lines)


def _status_note(execution: Execution) -> str:
    notes: list[str] = []
    reason = f" ({execution.reason})" if execution.reason else ""
    lost = ("The kernel was restarted: variables and imports are gone, files in the working "
            "directory are kept.")
    status = execution.status
    if status is ExecutionStatus.ERROR:
        name = execution.error.ename if execution.error else "an exception"
        notes.append(f"[status: error] The code raised {name}. Variables defined before the "
                     "error are kept: fix the code and run it again.")
    elif status is ExecutionStatus.TIMEOUT:
        notes.append(f"[status: timeout] The code ran past its time limit{reason} and was "
                     "interrupted. Make it faster, work on a sample, or pass a larger timeout_s.")
    elif status is ExecutionStatus.INTERRUPTED:
        notes.append(f"[status: interrupted] The execution was interrupted{reason}.")
    elif status is ExecutionStatus.DIED:
        process = "Python" if execution.language == "python" else execution.language
        notes.append(f"[status: died] The {process} process died{reason}, for instance out of "
                     "memory. Use less memory (smaller data, chunks).")
    elif status.value == "denied":  # statuses of the gateway's policy (governance)
        notes.append(f"[status: denied] The gateway's policy refused this code before it "
                     f"ran{reason}. Do it another way, or ask the user.")
    elif status.value == "budget_exceeded":
        notes.append(f"[status: budget_exceeded] The code was not run: this session's budget "
                     f"is used up{reason}.")
    elif status is not ExecutionStatus.OK:
        notes.append(f"[status: {status.value}] The execution did not complete "
                     f"normally{reason}.")
    if execution.restarted or status is ExecutionStatus.DIED:
        notes.append(lost)
    if execution.truncated:
        notes.append("[truncated] The output was longer than the cap: only its head and tail "
                     "are shown. The full text is in the file named in the notice above; read "
                     "parts of it in code, or print less.")
    return "\n".join(notes)
