"""Typed execution events, as the kernel pool yields them and the gateway streams them.

One execution yields ``stdout``/``stderr``/``display``/``result``/``error`` events in the order
the kernel produced them (plus ``clear_output`` and ``update_display`` where the code asked for
them), and always ends with exactly one ``done`` event. :class:`Execution` is the aggregate. A shell
command streams ``stdout``/``stderr`` events and ends with a :class:`CommandDone`;
:class:`CommandResult` is its aggregate.
An execution a policy holds for approval starts with ``pending_approval`` and ``approval``; one
refused before it ran (``denied``, ``budget_exceeded``) has only an ``error`` and its ``done``.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from kernel_pool._tracebacks import plain, short_form

CHART_MIME = "application/vnd.replgate.chart+json"
"""The MIME type under which the sandbox adds a figure's chart to its display bundle (and under
which a notebook export keeps it); on the wire the chart is the output's ``chart``."""


class ExecutionStatus(StrEnum):
    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    INTERRUPTED = "interrupted"
    DIED = "died"
    DENIED = "denied"
    """Refused before it ran: a policy rule, or an approval rejected or expired."""
    BUDGET_EXCEEDED = "budget_exceeded"
    """Refused before it ran: one of the session's budgets is used up."""


class ResourceUsage(BaseModel):
    """What one execution cost, read from the container's cgroup (null where unreadable)."""

    cpu_time_ms: float | None = None
    peak_memory_bytes: int | None = None


class StreamEvent(BaseModel):
    type: Literal["stdout", "stderr"]
    text: str


class DisplayEvent(BaseModel):
    """A rich output: ``display`` (display_data) or ``result`` (the cell's value)."""

    type: Literal["display", "result"]
    data: dict[str, Any]
    metadata: dict[str, Any] = Field(default_factory=dict)
    display_id: str | None = None
    chart: dict[str, Any] | None = None
    """A matplotlib figure's data in E2B's chart format (beside its ``image/png``)."""
    omitted: dict[str, int] | None = None
    """Bytes per MIME type of a bundle over the per-output cap, left out (``data`` then holds
    only a ``text/plain`` notice)."""


class UpdateDisplayEvent(BaseModel):
    type: Literal["update_display"] = "update_display"
    data: dict[str, Any]
    metadata: dict[str, Any] = Field(default_factory=dict)
    display_id: str
    omitted: dict[str, int] | None = None
    """As :attr:`DisplayEvent.omitted`."""


class ClearOutputEvent(BaseModel):
    type: Literal["clear_output"] = "clear_output"
    wait: bool = False


class ErrorEvent(BaseModel):
    type: Literal["error"] = "error"
    ename: str
    evalue: str
    traceback: list[str] = Field(default_factory=list)
    text: str = ""
    """The traceback as plain text (no ANSI colour codes); made from it when not given."""
    short: str = ""
    """The traceback's short form, for an agent: the frames of the user's own code and the
    exception line, with a sentence when the code met the sandbox's missing network
    (:mod:`kernel_pool._tracebacks`); made from it when not given."""

    @model_validator(mode="after")
    def _plain(self) -> ErrorEvent:
        self.text, self.short = _texts(self.traceback, self.text, self.short)
        return self


def _texts(traceback: list[str], text: str, short: str) -> tuple[str, str]:
    """An error's plain ``text`` and ``short`` form, each made from its traceback when empty."""
    if traceback:
        text = text or plain(traceback)
        short = short or short_form(traceback)
    return text, short


class FileChange(BaseModel):
    """A file an execution created, modified or deleted in the workspace."""

    path: str = Field(min_length=1)
    """Relative to the workspace."""
    size: int | None = Field(None, ge=0)
    """Bytes after the change; null for a deleted file."""
    change: Literal["created", "modified", "deleted"]


class DoneEvent(BaseModel):
    type: Literal["done"] = "done"
    status: ExecutionStatus
    execution_count: int | None
    truncated: bool = False
    restarted: bool = False
    duration_ms: float
    reason: str | None = None
    """Why the execution ended abnormally (timeout, crash, out of memory), for a person."""
    metrics: ResourceUsage = Field(default_factory=ResourceUsage)
    files: list[FileChange] = Field(default_factory=list)
    """What the code created, modified or deleted in the workspace (bounded: ``truncated``)."""
    reaped: int = Field(0, ge=0)
    """Processes the code left running in the sandbox (daemons, a fork bomb's), killed when it
    ended; none of them is left for the next execution."""
    language: str = "python"
    """The language it ran as (``r``, ``javascript``, ``typescript``, ``bash``: a code
    context's kernel)."""


class CommandStatus(StrEnum):
    OK = "ok"
    """It ran to its end (whatever its exit code)."""
    TIMEOUT = "timeout"
    KILLED = "killed"
    """Stopped on request."""


class CommandDone(BaseModel):
    """The last event of a command (on the WebSocket: ``done`` with its ``exit_code``)."""

    type: Literal["done"] = "done"
    status: CommandStatus
    exit_code: int | None
    """The shell's exit status (128 + N when killed by signal N); null after a timeout or kill."""
    truncated: bool = False
    duration_ms: float
    reason: str | None = None


class PtySize(BaseModel):
    """A terminal's size in characters, for a command run on a pty (and its resizes)."""

    cols: int = Field(80, ge=1, le=1000)
    rows: int = Field(24, ge=1, le=1000)


class CommandResult(BaseModel):
    """CONTRACT.md's answer to ``POST /v1/sessions/{id}/commands``."""

    id: str
    exit_code: int | None
    stdout: str
    stderr: str
    truncated: bool
    status: CommandStatus
    duration_ms: float
    reason: str | None = None


class PendingApprovalEvent(BaseModel):
    """The execution is held until a person with an approver key decides (or it expires)."""

    type: Literal["pending_approval"] = "pending_approval"
    approval_id: str
    rules: list[str] = Field(default_factory=list)
    """Ids of the policy rules that asked for approval."""
    expires_at: str


class ApprovalEvent(BaseModel):
    """What became of a pending approval; ``approved`` lets the execution run."""

    type: Literal["approval"] = "approval"
    approval_id: str
    decision: Literal["approved", "rejected", "expired"]
    by: str | None = None
    at: str
    comment: str | None = None


OutputEvent = StreamEvent | DisplayEvent | UpdateDisplayEvent | ClearOutputEvent | ErrorEvent
Event = Annotated[
    StreamEvent | DisplayEvent | UpdateDisplayEvent | ClearOutputEvent | ErrorEvent | DoneEvent
    | PendingApprovalEvent | ApprovalEvent,
    Field(discriminator="type"),
]


class Output(BaseModel):
    type: Literal["display", "result"]
    data: dict[str, Any]
    metadata: dict[str, Any] = Field(default_factory=dict)
    display_id: str | None = None
    chart: dict[str, Any] | None = None
    """A matplotlib figure's data in E2B's chart format (beside its ``image/png``)."""
    omitted: dict[str, int] | None = None
    """Bytes per MIME type of a bundle over the per-output cap, left out (``data`` then holds
    only a ``text/plain`` notice)."""


class ExecutionError(BaseModel):
    """The exception an execution raised (CONTRACT.md's ``error``).

    On the wire it is ``{"ename", "evalue", "traceback": [str], "text", "short"}``. In Python it
    also answers to the names of E2B's ``ExecutionError``: ``name``, ``value`` and
    ``traceback``, which is E2B's one string (Jupyter's lines joined, coloured); the list is
    :attr:`traceback_lines`.
    """

    model_config = ConfigDict(validate_by_name=True, serialize_by_alias=True)

    ename: str
    evalue: str
    traceback_lines: list[str] = Field(default_factory=list, alias="traceback")
    """Jupyter's traceback, one entry per block, with its ANSI colours (``traceback`` on the
    wire)."""
    text: str = ""
    """The traceback as plain text, without Jupyter's ANSI colour codes."""
    short: str = ""
    """As :attr:`ErrorEvent.short`: what an agent should read."""

    @model_validator(mode="after")
    def _plain(self) -> ExecutionError:
        self.text, self.short = _texts(self.traceback_lines, self.text, self.short)
        return self

    @property
    def name(self) -> str:
        """E2B's name of :attr:`ename`."""
        return self.ename

    @property
    def value(self) -> str:
        """E2B's name of :attr:`evalue`."""
        return self.evalue

    @property
    def traceback(self) -> str:
        """The traceback as E2B gives it: one string, Jupyter's entries joined by newlines."""
        return "\n".join(self.traceback_lines)

    def to_json(self) -> str:
        """E2B's JSON of an error: ``{"name", "value", "traceback"}``."""
        return json.dumps({"name": self.name, "value": self.value, "traceback": self.traceback})


class Execution(BaseModel):
    """The aggregate of one execution's events (CONTRACT.md's Execution)."""

    status: ExecutionStatus
    execution_count: int | None = None
    stdout: str = ""
    stderr: str = ""
    outputs: list[Output] = Field(default_factory=list)
    error: ExecutionError | None = None
    truncated: bool = False
    restarted: bool = False
    duration_ms: float = 0.0
    reason: str | None = None
    metrics: ResourceUsage = Field(default_factory=ResourceUsage)
    files: list[FileChange] = Field(default_factory=list)
    reaped: int = Field(0, ge=0)
    """As :attr:`DoneEvent.reaped`."""
    language: str = "python"
    """As :attr:`DoneEvent.language`."""

    @classmethod
    def from_events(cls, events: list[Any]) -> Execution:
        """Fold events (models or their dicts) into the aggregate, honouring clear/update."""
        builder = ExecutionBuilder()
        for event in events:
            builder.add(event)
        return builder.build()


class ExecutionBuilder:
    """Folds events into an :class:`Execution` as they arrive."""

    def __init__(self) -> None:
        self._stdout: list[str] = []
        self._stderr: list[str] = []
        self._outputs: list[Output] = []
        self._error: ExecutionError | None = None
        self._done: DoneEvent | None = None
        self._clear_pending = False

    def add(self, event: Any) -> None:
        if isinstance(event, dict):
            event = _EVENT_ADAPTER.validate_python(event)
        if self._clear_pending and not isinstance(
            event, DoneEvent | ClearOutputEvent | UpdateDisplayEvent
        ):
            self._clear()
        if isinstance(event, StreamEvent):
            (self._stdout if event.type == "stdout" else self._stderr).append(event.text)
        elif isinstance(event, DisplayEvent):
            self._outputs.append(Output(type=event.type, data=event.data,
                                        metadata=event.metadata, display_id=event.display_id,
                                        chart=event.chart, omitted=event.omitted))
        elif isinstance(event, UpdateDisplayEvent):
            for output in self._outputs:
                if output.display_id == event.display_id:
                    output.data, output.metadata = event.data, event.metadata
                    output.omitted = event.omitted
        elif isinstance(event, ClearOutputEvent):
            if event.wait:
                self._clear_pending = True
            else:
                self._clear()
        elif isinstance(event, ErrorEvent):
            self._error = ExecutionError(ename=event.ename, evalue=event.evalue,
                                         traceback=event.traceback, text=event.text,
                                         short=event.short)
        elif isinstance(event, DoneEvent):
            self._done = event

    def _clear(self) -> None:
        self._stdout.clear()
        self._stderr.clear()
        self._outputs.clear()
        self._clear_pending = False

    def build(self) -> Execution:
        done = self._done or DoneEvent(status=ExecutionStatus.DIED, execution_count=None,
                                       duration_ms=0.0, reason="execution did not finish")
        return Execution(
            status=done.status, execution_count=done.execution_count,
            stdout="".join(self._stdout), stderr="".join(self._stderr),
            outputs=list(self._outputs), error=self._error, truncated=done.truncated,
            restarted=done.restarted, duration_ms=done.duration_ms, reason=done.reason,
            metrics=done.metrics, files=done.files, reaped=done.reaped, language=done.language,
        )


_EVENT_ADAPTER: TypeAdapter[Any] = TypeAdapter(Event)
