"""replgate's kernel pool: warm, hardened, containerized Jupyter kernels for agents.

Usable on its own from any async Python::

    pool = KernelPool(PoolSettings(state_dir=Path("state")))
    await pool.start()
    session = await pool.create_session()
    result = await session.execute("1 + 1")   # Execution(status="ok", outputs=[...])
    await pool.close()

This package is kernel_pool's public face: the names below, pinned by
``tests/kernel_pool/test_exported_members.py``; its ``_modules`` are private. Names are imported
on first use, so ``from kernel_pool import Execution`` loads the event models (pydantic only)
and neither ZMQ nor the Docker SDK: the client of the gateway relies on it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernel_pool._commands import CommandEmit
    from kernel_pool._context_code import check_env, env_code
    from kernel_pool._contexts import ContextInfo
    from kernel_pool._egress import EgressAttempt
    from kernel_pool._entries import Entry, FileInfo
    from kernel_pool._handle import Denial, ExecutionHandle, Gate, refused_at_gate
    from kernel_pool._languages import (
        DEFAULT_CONTEXT,
        check_language,
        normalize_language,
    )
    from kernel_pool._pool import KernelPool
    from kernel_pool._queue import ExecutionQueue
    from kernel_pool._session import Session
    from kernel_pool._usage import SandboxUsage
    from kernel_pool._watch import DirWatch, WatchEvent
    from kernel_pool.backends.base import SandboxInfo
    from kernel_pool.config import OutputCaps, PoolLimits, PoolSettings, Profile, parse_size
    from kernel_pool.events import (
        CHART_MIME,
        ApprovalEvent,
        ClearOutputEvent,
        CommandDone,
        CommandResult,
        CommandStatus,
        DisplayEvent,
        DoneEvent,
        ErrorEvent,
        Event,
        Execution,
        ExecutionBuilder,
        ExecutionError,
        ExecutionStatus,
        FileChange,
        Output,
        OutputEvent,
        PendingApprovalEvent,
        PtySize,
        ResourceUsage,
        StreamEvent,
        UpdateDisplayEvent,
    )
    from kernel_pool.exceptions import (
        BackendError,
        CapacityError,
        CommandInputClosed,
        CommandNotFound,
        ContextNotFound,
        ContextStartFailed,
        ExecutionIdTaken,
        FileMissing,
        FileTooLarge,
        ImageError,
        InvalidRequest,
        KernelPoolError,
        KernelStartError,
        KernelUnavailable,
        NodeUnreachable,
        NoNodeAvailable,
        NotDrainable,
        PathOutsideWorkspace,
        PayloadTooLarge,
        ProfileNotFound,
        QueueFull,
        SessionClosed,
        SessionNotFound,
        SnapshotBudgetExceeded,
        SnapshotError,
        SnapshotNotFound,
        StateDirFull,
        TooManyCommands,
        TooManyWatches,
        UnknownLanguage,
        UnknownNode,
        WorkspaceError,
        WorkspaceFull,
    )
    from kernel_pool.port import (
        ClosedListener,
        Listener,
        SessionHost,
        SessionPort,
        TransferListener,
    )
    from kernel_pool.state import (
        NodeRecord,
        PauseInfo,
        SessionState,
        SessionStatus,
        SnapshotSaved,
        Transfer,
    )

__all__ = [
    "CHART_MIME",
    "DEFAULT_CONTEXT",
    "ApprovalEvent",
    "BackendError",
    "CapacityError",
    "ClearOutputEvent",
    "ClosedListener",
    "CommandDone",
    "CommandEmit",
    "CommandInputClosed",
    "CommandNotFound",
    "CommandResult",
    "CommandStatus",
    "ContextInfo",
    "ContextNotFound",
    "ContextStartFailed",
    "Denial",
    "DirWatch",
    "DisplayEvent",
    "DoneEvent",
    "EgressAttempt",
    "Entry",
    "ErrorEvent",
    "Event",
    "Execution",
    "ExecutionBuilder",
    "ExecutionError",
    "ExecutionHandle",
    "ExecutionIdTaken",
    "ExecutionQueue",
    "ExecutionStatus",
    "FileChange",
    "FileInfo",
    "FileMissing",
    "FileTooLarge",
    "Gate",
    "ImageError",
    "InvalidRequest",
    "KernelPool",
    "KernelPoolError",
    "KernelStartError",
    "KernelUnavailable",
    "Listener",
    "NoNodeAvailable",
    "NodeRecord",
    "NodeUnreachable",
    "NotDrainable",
    "Output",
    "OutputCaps",
    "OutputEvent",
    "PathOutsideWorkspace",
    "PauseInfo",
    "PayloadTooLarge",
    "PendingApprovalEvent",
    "PoolLimits",
    "PoolSettings",
    "Profile",
    "ProfileNotFound",
    "PtySize",
    "QueueFull",
    "ResourceUsage",
    "SandboxInfo",
    "SandboxUsage",
    "Session",
    "SessionClosed",
    "SessionHost",
    "SessionNotFound",
    "SessionPort",
    "SessionState",
    "SessionStatus",
    "SnapshotBudgetExceeded",
    "SnapshotError",
    "SnapshotNotFound",
    "SnapshotSaved",
    "StateDirFull",
    "StreamEvent",
    "TooManyCommands",
    "TooManyWatches",
    "Transfer",
    "TransferListener",
    "UnknownLanguage",
    "UnknownNode",
    "UpdateDisplayEvent",
    "WatchEvent",
    "WorkspaceError",
    "WorkspaceFull",
    "check_env",
    "check_language",
    "env_code",
    "normalize_language",
    "parse_size",
    "refused_at_gate",
]

_HOMES = {
    "CommandEmit": "kernel_pool._commands",
    "DEFAULT_CONTEXT": "kernel_pool._languages",
    "check_env": "kernel_pool._context_code",
    "check_language": "kernel_pool._languages",
    "env_code": "kernel_pool._context_code",
    "normalize_language": "kernel_pool._languages",
    "refused_at_gate": "kernel_pool._handle",
    "ApprovalEvent": "kernel_pool.events",
    "BackendError": "kernel_pool.exceptions",
    "CHART_MIME": "kernel_pool.events",
    "CapacityError": "kernel_pool.exceptions",
    "ClearOutputEvent": "kernel_pool.events",
    "CommandDone": "kernel_pool.events",
    "CommandInputClosed": "kernel_pool.exceptions",
    "CommandNotFound": "kernel_pool.exceptions",
    "CommandResult": "kernel_pool.events",
    "CommandStatus": "kernel_pool.events",
    "ContextInfo": "kernel_pool._contexts",
    "ContextNotFound": "kernel_pool.exceptions",
    "ContextStartFailed": "kernel_pool.exceptions",
    "Denial": "kernel_pool._handle",
    "DisplayEvent": "kernel_pool.events",
    "DoneEvent": "kernel_pool.events",
    "EgressAttempt": "kernel_pool._egress",
    "ErrorEvent": "kernel_pool.events",
    "Event": "kernel_pool.events",
    "Execution": "kernel_pool.events",
    "ExecutionBuilder": "kernel_pool.events",
    "ExecutionError": "kernel_pool.events",
    "ExecutionHandle": "kernel_pool._handle",
    "ExecutionIdTaken": "kernel_pool.exceptions",
    "ExecutionStatus": "kernel_pool.events",
    "Entry": "kernel_pool._entries",
    "FileChange": "kernel_pool.events",
    "FileInfo": "kernel_pool._entries",
    "FileMissing": "kernel_pool.exceptions",
    "FileTooLarge": "kernel_pool.exceptions",
    "Gate": "kernel_pool._handle",
    "ImageError": "kernel_pool.exceptions",
    "InvalidRequest": "kernel_pool.exceptions",
    "KernelPool": "kernel_pool._pool",
    "NotDrainable": "kernel_pool.exceptions",
    "UnknownNode": "kernel_pool.exceptions",
    "NoNodeAvailable": "kernel_pool.exceptions",
    "NodeUnreachable": "kernel_pool.exceptions",
    "ExecutionQueue": "kernel_pool._queue",
    "KernelPoolError": "kernel_pool.exceptions",
    "KernelStartError": "kernel_pool.exceptions",
    "KernelUnavailable": "kernel_pool.exceptions",
    "Listener": "kernel_pool.port",
    "Output": "kernel_pool.events",
    "OutputCaps": "kernel_pool.config",
    "OutputEvent": "kernel_pool.events",
    "PathOutsideWorkspace": "kernel_pool.exceptions",
    "PauseInfo": "kernel_pool.state",
    "PayloadTooLarge": "kernel_pool.exceptions",
    "PendingApprovalEvent": "kernel_pool.events",
    "PoolLimits": "kernel_pool.config",
    "PoolSettings": "kernel_pool.config",
    "Profile": "kernel_pool.config",
    "ProfileNotFound": "kernel_pool.exceptions",
    "PtySize": "kernel_pool.events",
    "QueueFull": "kernel_pool.exceptions",
    "ResourceUsage": "kernel_pool.events",
    "SandboxInfo": "kernel_pool.backends.base",
    "SandboxUsage": "kernel_pool._usage",
    "Session": "kernel_pool._session",
    "SessionPort": "kernel_pool.port",
    "SessionHost": "kernel_pool.port",
    "ClosedListener": "kernel_pool.port",
    "SessionClosed": "kernel_pool.exceptions",
    "SessionNotFound": "kernel_pool.exceptions",
    "SessionStatus": "kernel_pool.state",
    "SessionState": "kernel_pool.state",
    "NodeRecord": "kernel_pool.state",
    "SnapshotBudgetExceeded": "kernel_pool.exceptions",
    "SnapshotError": "kernel_pool.exceptions",
    "SnapshotNotFound": "kernel_pool.exceptions",
    "SnapshotSaved": "kernel_pool.state",
    "StateDirFull": "kernel_pool.exceptions",
    "StreamEvent": "kernel_pool.events",
    "TooManyCommands": "kernel_pool.exceptions",
    "TooManyWatches": "kernel_pool.exceptions",
    "DirWatch": "kernel_pool._watch",
    "WatchEvent": "kernel_pool._watch",
    "Transfer": "kernel_pool.state",
    "TransferListener": "kernel_pool.port",
    "UnknownLanguage": "kernel_pool.exceptions",
    "UpdateDisplayEvent": "kernel_pool.events",
    "WorkspaceError": "kernel_pool.exceptions",
    "WorkspaceFull": "kernel_pool.exceptions",
    "parse_size": "kernel_pool.config",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'kernel_pool' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value  # found once; later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
