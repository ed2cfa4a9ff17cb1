"""replgate's execution events as the lines of E2B's ``/execute`` stream (NDJSON).

    {"type": "stdout" | "stderr", "text", "timestamp"}
    {"type": "result", "text", "html", ..., "chart", "extra", "is_main_result"}
    {"type": "error", "name", "value", "traceback"}     traceback: one string
    {"type": "number_of_executions", "execution_count"}
    {"type": "keepalive"}                               while nothing else is said
    {"type": "end_of_execution"}                        last

A run that ends without the kernel's own error (replgate's timeout, a dead kernel, an
interrupt) gets an ``error`` line saying why, so the SDK's ``Execution.error`` is never silent.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kernel_pool import (
    DisplayEvent,
    DoneEvent,
    ErrorEvent,
    Event,
    ExecutionStatus,
    StreamEvent,
    UpdateDisplayEvent,
)

FIELDS = {
    "text/plain": "text", "text/html": "html", "text/markdown": "markdown",
    "image/svg+xml": "svg", "image/png": "png", "image/jpeg": "jpeg",
    "application/pdf": "pdf", "text/latex": "latex", "application/json": "json",
    "application/javascript": "javascript", "e2b/data": "data", "e2b/chart": "chart",
    "application/vnd.replgate.data+json": "data", "application/vnd.replgate.value+json": "json",
}
"""MIME types to the fields of E2B's ``Result``; any other type goes to ``extra``. A pandas
DataFrame's columns come as ``application/vnd.replgate.data+json`` (the sandbox's
``replgate_kernel/data.py``: E2B's ``e2b/data`` under a name a notebook keeps as JSON), a list's
or dict's value as ``application/vnd.replgate.value+json`` (E2B's kernel adds it as
``application/json``, which Jupyter's front ends would show instead of the text)."""

END = {"type": "end_of_execution"}
KEEPALIVE = {"type": "keepalive"}

_ENDINGS = {
    ExecutionStatus.TIMEOUT: "TimeoutError",
    ExecutionStatus.DIED: "DeadKernelError",
    ExecutionStatus.INTERRUPTED: "KeyboardInterrupt",
}


def result_line(data: dict[str, Any], is_main_result: bool,
                chart: dict[str, Any] | None = None) -> dict[str, Any]:
    """A display bundle as E2B's ``Result``; ``chart`` is a figure's data (E2B's format)."""
    line: dict[str, Any] = {"type": "result", "is_main_result": is_main_result}
    extra: dict[str, Any] = {}
    for mime, value in data.items():
        field = FIELDS.get(mime)
        if field is None:
            extra[mime] = value
        else:
            line[field] = value
    text = line.get("text")
    # E2B's code interpreter shows a string result without its repr quotes ('a' -> a).
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        line["text"] = text[1:-1]
    if extra:
        line["extra"] = extra
    if chart is not None:
        line["chart"] = chart
    return line


LINE_BY_LINE = frozenset({"java"})
"""Languages whose output E2B's kernel sends a line's text and its line break apart: IJava
writes each ``print`` as it comes, so ``println("x")`` is ``"x"`` then ``"\n"``, and code
written for E2B reads ``logs.stdout[0]`` as the line. JJava sends ``"x\n"`` in one message."""


def _pieces(text: str) -> list[str]:
    """``"a\nb\n"`` as ``["a", "\n", "b", "\n"]``."""
    return [piece for line in text.splitlines(keepends=True)
            for piece in (line.rstrip("\r\n"), line[len(line.rstrip("\r\n")):]) if piece]


class Translator:
    """Turns one execution's events into E2B lines, remembering whether an error was said."""

    def __init__(self, language: str = "python") -> None:
        self._errored = False
        self._line_by_line = language in LINE_BY_LINE

    def lines(self, event: Event) -> list[dict[str, Any]]:
        if isinstance(event, StreamEvent):
            now = datetime.now(UTC).isoformat()
            texts = _pieces(event.text) if self._line_by_line else [event.text]
            return [{"type": event.type, "text": text, "timestamp": now} for text in texts]
        if isinstance(event, DisplayEvent):
            return [result_line(event.data, event.type == "result", event.chart)]
        if isinstance(event, UpdateDisplayEvent):
            return [result_line(event.data, False)]
        if isinstance(event, ErrorEvent):
            self._errored = True
            return [{"type": "error", "name": event.ename, "value": event.evalue,
                     "traceback": "\n".join(event.traceback)}]
        if isinstance(event, DoneEvent):
            return self._done(event)
        return []  # clear_output and approval notices have no E2B counterpart

    def _done(self, done: DoneEvent) -> list[dict[str, Any]]:
        lines: list[dict[str, Any]] = []
        ended_badly = done.status not in (ExecutionStatus.OK, ExecutionStatus.ERROR)
        if ended_badly and not self._errored:
            name = _ENDINGS.get(done.status, done.status.value)
            lines.append({"type": "error", "name": name,
                          "value": done.reason or f"the execution ended: {done.status.value}",
                          "traceback": ""})
        if done.execution_count is not None:
            lines.append({"type": "number_of_executions",
                          "execution_count": done.execution_count})
        return lines
