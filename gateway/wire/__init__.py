"""The wire: every request, response and frame of the HTTP and WebSocket API (CONTRACT.md).

Pydantic only: the server and :mod:`gateway.client` both import it, so an agent's client needs
neither FastAPI nor Docker. The event models are kernel_pool's (its public, pydantic-only
face); a WebSocket carries each as an :class:`EventFrame`, the event's fields plus the
execution's id.

This package's face: its names are defined in rooms of one resource each (sessions, contexts,
executions, commands, files, approvals, health, the WebSocket's client messages and server
frames, Jupyter's kernels) and imported from here, ``from gateway.wire import X``.
"""

from __future__ import annotations

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

from ._approvals import Approval, ApprovalStatus, DecisionIn
from ._base import EnvName, Timeout
from ._commands import CommandRequest, KillOut
from ._contexts import ContextCreate as ContextCreate
from ._contexts import ContextOut as ContextOut
from ._executions import ExecuteRequest, ExecutionOut, ExecutionSummary, InterruptOut
from ._files import FileWritten
from ._frames import (
    EVENT_TYPES,
    CommandFrame,
    CommandKilledFrame,
    EventFrame,
    ExecutionStartFrame,
    Frame,
    HistoryEndFrame,
    InterruptedFrame,
    LaggedFrame,
    RejectedFrame,
    TransferFrame,
)
from ._health import Health
from ._jupyter import KernelCreate, KernelModel
from ._messages import WsClientMessage, WsCommand, WsExecute, WsInterrupt, WsKillCommand
from ._secrets import SecretIn, SecretOut
from ._sessions import (
    SESSION_STATES,
    BudgetOut,
    SessionCreate,
    SessionMetricsOut,
    SessionOut,
)
from ._sessions import ForkRequest as ForkRequest
from ._sessions import TransferOut as TransferOut
from ._snapshots import SnapshotCreate, SnapshotOut, SnapshotSessionCreate
from ._templates import LogLine, TemplateCreate, TemplateInfo, TemplatePublish, TemplateStatus
from ._terminals import (
    CommandInput,
    TerminalClientMessage,
    TerminalExit,
    TerminalInput,
    TerminalKill,
    TerminalOutput,
    TerminalResize,
    TerminalSize,
    TerminalStarted,
)
from ._watch import WatchChange, WatchEndFrame, WatchFrame, WatchReadyFrame

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
    "CommandInput",
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
    "LogLine",
    "Output",
    "OutputEvent",
    "PendingApprovalEvent",
    "RejectedFrame",
    "ResourceUsage",
    "SecretIn",
    "SecretOut",
    "SessionCreate",
    "SessionMetricsOut",
    "SessionOut",
    "SnapshotCreate",
    "SnapshotOut",
    "SnapshotSessionCreate",
    "StreamEvent",
    "TemplateCreate",
    "TemplateInfo",
    "TemplatePublish",
    "TemplateStatus",
    "TerminalClientMessage",
    "TerminalExit",
    "TerminalInput",
    "TerminalKill",
    "TerminalOutput",
    "TerminalResize",
    "TerminalSize",
    "TerminalStarted",
    "Timeout",
    "TransferFrame",
    "UpdateDisplayEvent",
    "WatchChange",
    "WatchEndFrame",
    "WatchFrame",
    "WatchReadyFrame",
    "WsClientMessage",
    "WsCommand",
    "WsExecute",
    "WsInterrupt",
    "WsKillCommand",
]
