"""The wire: every request, response and frame of the HTTP and WebSocket API (CONTRACT.md).

Pydantic only: the server and :mod:`gateway.client` both import it, so an agent's client needs
neither FastAPI nor Docker. The event models are kernel_pool's (its public, pydantic-only
face); a WebSocket carries each as an :class:`EventFrame`, the event's fields plus the
execution's id.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from kernel_pool import (
    CHART_MIME,
    ApprovalEvent,
    ClearOutputEvent,
    CommandDone,
    CommandResult,
    CommandStatus,
    DisplayEvent,
    DoneEvent,
    EgressAttempt,
    ErrorEvent,
    Event,
    Execution,
    ExecutionBuilder,
    ExecutionError,
    ExecutionStatus,
    FileChange,
    FileInfo,
    Output,
    OutputEvent,
    PendingApprovalEvent,
    ResourceUsage,
    StreamEvent,
    UpdateDisplayEvent,
)

__all__ = [
    "CHART_MIME",
    "EVENT_TYPES",
    "SESSION_STATES",
    "Approval",
    "ApprovalEvent",
    "ApprovalStatus",
    "BudgetOut",
    "ClearOutputEvent",
    "CommandDone",
    "CommandFrame",
    "CommandKilledFrame",
    "CommandRequest",
    "CommandResult",
    "CommandStatus",
    "DecisionIn",
    "DisplayEvent",
    "DoneEvent",
    "EgressAttempt",
    "EnvName",
    "ErrorEvent",
    "Event",
    "EventFrame",
    "ExecuteRequest",
    "Execution",
    "ExecutionBuilder",
    "ExecutionError",
    "ExecutionOut",
    "ExecutionStartFrame",
    "ExecutionStatus",
    "ExecutionSummary",
    "FileChange",
    "FileInfo",
    "FileWritten",
    "Frame",
    "Health",
    "HistoryEndFrame",
    "InterruptOut",
    "InterruptedFrame",
    "KernelCreate",
    "KernelModel",
    "KillOut",
    "LaggedFrame",
    "Output",
    "OutputEvent",
    "PendingApprovalEvent",
    "RejectedFrame",
    "ResourceUsage",
    "SessionCreate",
    "SessionMetricsOut",
    "SessionOut",
    "StreamEvent",
    "Timeout",
    "TransferFrame",
    "UpdateDisplayEvent",
    "WsClientMessage",
    "WsCommand",
    "WsExecute",
    "WsInterrupt",
    "WsKillCommand",
]

EVENT_TYPES: frozenset[str] = frozenset(
    kind for model in get_args(get_args(Event)[0])
    for kind in get_args(model.model_fields["type"].annotation))
"""Every event ``type`` (``stdout``, ..., ``done``); a client skips frames of other types,
which a newer gateway may send."""

ApprovalStatus = Literal["pending", "approved", "rejected", "expired", "withdrawn"]

SESSION_STATES = ("idle", "busy", "starting", "dead", "paused")
"""What ``Session.status`` may be; a client reads it as a plain string, so that a state a
newer gateway adds does not break it."""

EnvName = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
Timeout = Annotated[float, Field(gt=0, description="seconds; at most the profile's maximum")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SessionCreate(Strict):
    profile: str = Field("default", max_length=128)
    timeout_s: Timeout | None = Field(None, description="default timeout of this session's runs")
    env: dict[EnvName, Annotated[str, Field(max_length=32_768)]] = Field(
        default_factory=dict, max_length=256)
    metadata: dict[str, Any] = Field(default_factory=dict)


class BudgetOut(BaseModel):
    """What is left of the session's budgets (policy file); null where unlimited."""

    executions_left: int | None = None
    wall_time_left_s: float | None = None
    cpu_time_left_s: float | None = None
    lifetime_left_s: float | None = None


class TransferOut(BaseModel):
    """A pause or resume under way, for a progress bar: the variables' stream so far."""

    operation: Literal["pause", "resume"]
    done_bytes: int
    total_bytes: int = Field(description="a pause: the sandbox's memory in use as it began "
                             "(about the snapshot's size); a resume: the stored snapshot's "
                             "size; 0 when not known")


class SessionMetricsOut(BaseModel):
    """A session's sandbox use now (``GET /v1/sessions/{id}/metrics``, CONTRACT.md)."""

    cpu_used_pct: float = Field(description="CPU used over the last few seconds, as a "
                                "percentage of the sandbox's CPU limit (0 while paused)")
    mem_used_bytes: int = Field(description="memory in use, page cache included as the limit "
                                "counts it (0 while paused)")
    mem_limit_bytes: int
    disk_used_bytes: int = Field(description="what the workspace's files hold")
    disk_limit_bytes: int = Field(description="the workspace's size cap")
    at: str = Field(description="when the figures were read (ISO 8601)")


class SessionOut(BaseModel):
    """A session (CONTRACT.md's Session); the client's ``SessionInfo``."""

    id: str
    tenant: str
    profile: str
    status: Annotated[str, Field(json_schema_extra={"enum": list(SESSION_STATES)})]
    execution_count: int
    created_at: str
    last_active_at: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    budget: BudgetOut = Field(default_factory=BudgetOut)
    paused_with: Literal["memory", "variables"] | None = Field(
        None, description="while paused, what was kept: the whole process (memory) or the "
        "variables only (variables: threads, open files and /tmp are not kept)")
    not_kept: dict[str, str] | None = Field(
        None, description="while paused: variables that could not be kept, with the reason")
    snapshot_bytes: int | None = Field(None, description="while paused: the snapshot's size")
    reason: str | None = Field(None, description="why the last pause, resume or fork failed "
                               "or kept less than asked (a memory pause that kept the variables "
                               "only, a resume from the variables snapshot); the session runs "
                               "on or stays paused, restorable")
    transfer: TransferOut | None = Field(None, description="while a pause or resume moves the "
                                         "session's variables: how far it is")
    node: str | None = Field(None, description="the id of the node running it (one machine: "
                             "the gateway's own, REPLGATE_OWNER); null while paused")


class ForkRequest(Strict):
    count: int = Field(1, ge=1, le=16, description="how many copies")
    metadata: dict[str, Any] = Field(default_factory=dict)


Language = Annotated[str, Field(max_length=32, description=(
    "python (the default), r, javascript (js), typescript (ts) or bash, any case; the "
    "session's image must offer it"))]
ContextId = Annotated[str, Field(min_length=1, max_length=64, description=(
    "a code context of the session (GET /v1/sessions/{id}/contexts)"))]


class ExecuteRequest(Strict):
    code: str
    timeout_s: Timeout | None = None
    language: Language | None = None
    context_id: ContextId | None = None


class ContextCreate(Strict):
    """``POST /v1/sessions/{id}/contexts``: another kernel of a language in the session."""

    language: Language = "python"
    cwd: str | None = Field(default=None, max_length=4096, description=(
        "the folder its kernel starts in (absolute, or relative to the workspace); it must "
        "exist and be the sandbox user's to enter. Default: the workspace"))


class ContextOut(BaseModel):
    """A code context: a kernel of the session, with its own variables."""

    id: str
    language: str = Field(description="python, r, javascript (TypeScript runs there too) "
                          "or bash")
    execution_count: int
    running: bool = Field(description="whether its kernel runs now (a context starts it at "
                          "its first execution)")
    cwd: str | None = Field(default=None, description="the folder its kernel starts in, as "
                            "asked; null: the workspace")


class ExecutionOut(Execution):
    """The contract's Execution, plus the execution's id (to find it again in the history)."""

    id: str


class ExecutionSummary(BaseModel):
    id: str
    seq: int
    code: str
    status: str
    execution_count: int | None
    started_at: str
    finished_at: str | None
    result: Execution | None = None


class CommandRequest(Strict):
    """``POST /v1/sessions/{id}/commands``: a shell command to run beside the kernel."""

    cmd: str = Field(max_length=100_000, description="run as `sh -c CMD`")
    timeout_s: Timeout | None = None
    env: dict[EnvName, Annotated[str, Field(max_length=32_768)]] = Field(
        default_factory=dict, max_length=256, description="added to the session's environment")
    cwd: str | None = Field(None, max_length=4096,
                            description="folder relative to the workspace, or under "
                            "/home/user, where the sandbox has it (default: its root)")
    id: str | None = Field(None, min_length=1, max_length=128,
                           pattern=r"^[A-Za-z0-9_.-]+$",
                           description="a name for the command, to kill it while it runs")


class KillOut(BaseModel):
    killed: bool


class InterruptOut(BaseModel):
    interrupted: bool


class FileWritten(BaseModel):
    path: str
    size: int


class DecisionIn(Strict):
    """``POST /v1/approvals/{id}/approve`` or ``/reject``: an optional comment."""

    comment: str | None = Field(None, max_length=2000)


class Approval(BaseModel):
    """One held execution and what became of it (the wire shape of ``/v1/approvals``)."""

    approval_id: str
    tenant: str
    session_id: str
    execution_id: str
    code: str
    rules: list[dict[str, Any]] = Field(default_factory=list)
    """The policy matches that asked for approval: rule, action, message, line, matched."""
    status: ApprovalStatus = "pending"
    created_at: str
    expires_at: str
    decided_by: str | None = None
    decided_at: str | None = None
    comment: str | None = None


class Health(BaseModel):
    status: Literal["ok"]
    version: str
    pool: dict[str, int]


# -- WebSocket client messages -----------------------------------------------------------------


class WsExecute(Strict):
    type: Literal["execute"]
    traceparent: str | None = Field(None, max_length=256, description="W3C trace context: the "
                                    "trace the execution's spans join (else the socket's)")
    tracestate: str | None = Field(None, max_length=4096)
    code: str
    timeout_s: Timeout | None = None
    id: str | None = Field(None, min_length=1, max_length=128)
    language: Language | None = None
    context_id: ContextId | None = None


class WsInterrupt(Strict):
    type: Literal["interrupt"]


class WsCommand(CommandRequest):
    """Run a shell command; its output streams as ``stdout``/``stderr`` events, then ``done``
    with ``exit_code``, each with the command's id as ``execution_id`` and ``command_id``."""

    type: Literal["command"]


class WsKillCommand(Strict):
    type: Literal["kill_command"]
    id: str


WsClientMessage = Annotated[WsExecute | WsInterrupt | WsCommand | WsKillCommand,
                            Field(discriminator="type")]


# -- WebSocket server frames -------------------------------------------------------------------


class Frame(BaseModel):
    """A message the gateway sends on a WebSocket."""

    def text(self) -> str:
        """The frame as the socket carries it: one JSON text message."""
        return self.model_dump_json()


class EventFrame(Frame):
    """An execution's event: the event's own fields plus ``execution_id`` (flat on the wire)."""

    execution_id: str
    event: Event

    @model_validator(mode="before")
    @classmethod
    def _nest(cls, value: Any) -> Any:
        if isinstance(value, dict) and "event" not in value:
            fields = dict(value)
            return {"execution_id": fields.pop("execution_id", None), "event": fields}
        return value

    @model_serializer(mode="wrap")
    def _flatten(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        nested = handler(self)
        return {**nested["event"], "execution_id": nested["execution_id"]}


class CommandFrame(Frame):
    """A shell command's event on the session socket, flat: ``stdout``/``stderr`` or its
    ``done`` (with ``exit_code``), plus the command's id as ``execution_id`` and ``command_id``."""

    command_id: str
    event: StreamEvent | CommandDone

    @model_serializer(mode="wrap")
    def _flatten(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        nested = handler(self)
        return {**nested["event"], "execution_id": self.command_id,
                "command_id": self.command_id}


class CommandKilledFrame(Frame):
    """The answer to ``{"type": "kill_command", "id"}``: whether that command was running."""

    type: Literal["command_killed"] = "command_killed"
    execution_id: str
    command_id: str
    killed: bool


class RejectedFrame(Frame):
    """A request on the session socket that was refused instead of run; ``status_code`` is
    what the HTTP API would have answered."""

    type: Literal["rejected"] = "rejected"
    execution_id: str | None
    status_code: int
    detail: Any


class InterruptedFrame(Frame):
    """The answer to ``{"type": "interrupt"}``: whether something was running."""

    type: Literal["interrupted"] = "interrupted"
    execution_id: None = None
    interrupted: bool


class ExecutionStartFrame(Frame):
    """On the watch socket: an execution began (its events follow as :class:`EventFrame`)."""

    type: Literal["execution"] = "execution"
    execution_id: str
    code: str
    started_at: str | None


class HistoryEndFrame(Frame):
    """On the watch socket: the history is sent; what follows is live."""

    type: Literal["history_end"] = "history_end"


class LaggedFrame(Frame):
    """On the watch socket: the watcher fell behind and is disconnected; reconnect."""

    type: Literal["lagged"] = "lagged"
    detail: str


class TransferFrame(Frame):
    """On the session and watch sockets: a pause or resume of the session moving its
    variables, for a progress bar. Sent as it starts, at most every 250 ms while its bytes
    advance, and once at its end (``state`` done or failed)."""

    type: Literal["transfer"] = "transfer"
    execution_id: str | None = Field(
        None, description="the execution whose start resumed the paused session (its output "
        "follows); null for a pause, or a resume asked by itself")
    operation: Literal["pause", "resume"]
    state: Literal["running", "done", "failed"] = Field(
        description="done: every byte moved (done_bytes == total_bytes); failed: the session "
        "runs on, or stays paused, restorable (its reason says why)")
    done_bytes: int
    total_bytes: int = Field(description="as the Session's transfer says; 0 when not known")


# -- Jupyter's kernel API (``/api/kernels``) ----------------------------------------------------


class KernelCreate(BaseModel):
    """``POST /api/kernels``: what jupyter_server's gateway client sends (other keys ignored)."""

    model_config = ConfigDict(extra="ignore")
    name: str | None = Field(None, max_length=128)
    env: dict[EnvName, Annotated[str, Field(max_length=32_768)]] = Field(
        default_factory=dict, max_length=256)


class KernelModel(BaseModel):
    """A kernel as Jupyter's REST API describes it (a replgate session)."""

    id: str
    name: str
    last_activity: str
    execution_state: str
    connections: int
