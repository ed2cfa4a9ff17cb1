"""What can go wrong at the gateway, and the one table saying what each answer is.

The gateway's own errors (the pool's and the nodes' are in :mod:`kernel_pool.exceptions`, the
store's in :mod:`common.store`); none carries an HTTP status: :data:`STATUS_BY_ERROR` maps every
domain error to one, for the gateway's answers (:mod:`gateway.errors`: WebSocket close codes
mirror them, 4000 + status) and the node's alike::

    GatewayError
    ├── Unauthorized        missing or wrong API key
    ├── Forbidden           an action the caller's key may not take
    ├── NotFound            an approval, kernelspec or UI file that does not exist
    ├── Conflict            the request contradicts what is already so (an approval decided)
    ├── TooManyRequests     a per-tenant limit is reached
    ├── InvalidInput        a value the API refuses (out of range, not text)
    └── MalformedMessage    a WebSocket message that is not JSON or not a known shape

Raise sites name the error and say the sentence; the status is chosen here, by class, never by
the message's text.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from common.database import StoreError
from common.store import RecordExists, RecordNotFound
from kernel_pool import (
    BackendError,
    CapacityError,
    CommandInputClosed,
    CommandNotFound,
    ContextNotFound,
    ContextStartFailed,
    ExecutionIdTaken,
    FileMissing,
    ImageError,
    InvalidRequest,
    KernelPoolError,
    KernelStartError,
    KernelUnavailable,
    NoNodeAvailable,
    NotDrainable,
    PayloadTooLarge,
    ProfileNotFound,
    QueueFull,
    SandboxDiskFull,
    SandboxFileDenied,
    SandboxFileError,
    SandboxFileExists,
    SandboxFileMissing,
    SessionClosed,
    SessionNotFound,
    SnapshotBudgetExceeded,
    SnapshotError,
    SnapshotNotFound,
    StateDirFull,
    TooManyCommands,
    TooManyWatches,
    UnknownNode,
    WorkspaceError,
)

__all__ = [
    "DATABASE_AWAY",
    "DOMAIN_ERRORS",
    "STATUS_BY_ERROR",
    "Conflict",
    "Forbidden",
    "GatewayError",
    "InvalidInput",
    "MalformedMessage",
    "NotFound",
    "TooManyRequests",
    "Unauthorized",
    "detail_for",
    "is_database_error",
    "status_for",
]


class GatewayError(Exception):
    """Base of the gateway's own errors; the message is the answer's ``detail``."""

    def __init__(self, detail: Any) -> None:
        super().__init__(detail)
        self.detail = detail


class Unauthorized(GatewayError):
    """No key, or one the gateway does not know."""


class Forbidden(GatewayError):
    """The key is known but may not do this (an agent key deciding an approval)."""


class NotFound(GatewayError):
    """Something other than a session that does not exist (those are SessionNotFound)."""


class Conflict(GatewayError):
    """The request contradicts what is already so."""


class TooManyRequests(GatewayError):
    """A per-tenant limit (sessions, running executions) is reached; retry later."""


class InvalidInput(GatewayError):
    """A value the API refuses; the sentence names the limit or the expected form."""


class MalformedMessage(GatewayError):
    """A WebSocket message that is not JSON, or not one of the messages the socket takes;
    ``detail`` may be pydantic's list of validation errors."""


DOMAIN_ERRORS = (GatewayError, KernelPoolError, StoreError)
"""What a request may fail with on purpose; anything else is a bug (500, logged)."""

STATUS_BY_ERROR: Sequence[tuple[type[Exception], int]] = (
    # the gateway's own
    (Unauthorized, 401),
    (Forbidden, 403),
    (NotFound, 404),
    (Conflict, 409),
    (MalformedMessage, 422),
    (TooManyRequests, 429),
    (InvalidInput, 400),
    # the pool's (most specific first: the first match wins)
    (SessionNotFound, 404),
    (SessionClosed, 404),
    (ContextNotFound, 404),
    # its folder was removed or cannot be entered since the context was made: the caller's
    # files, not the server, are at odds with it
    (ContextStartFailed, 409),
    (FileMissing, 404),
    (ProfileNotFound, 400),
    (InvalidRequest, 400),
    (WorkspaceError, 400),
    (ExecutionIdTaken, 409),
    (PayloadTooLarge, 413),
    (QueueFull, 429),
    (TooManyCommands, 429),
    (CommandNotFound, 404),
    (CommandInputClosed, 409),
    (TooManyWatches, 429),
    # a limit (REPLGATE_MAX_KERNELS) reached after a wait for room: try again later
    (CapacityError, 429),
    (KernelStartError, 503),
    (KernelUnavailable, 503),
    (BackendError, 503),
    (ImageError, 503),
    (StateDirFull, 507),
    # the nodes'
    (UnknownNode, 404),
    (NoNodeAvailable, 503),
    # one machine has nowhere to drain its one node to (it was the gateway's Conflict)
    (NotDrainable, 409),
    (SnapshotBudgetExceeded, 507),
    (SnapshotNotFound, 404),
    (SnapshotError, 409),
    # the sandbox's own files (outside the workspace), refused by the sandbox to its user
    (SandboxFileMissing, 404),
    (SandboxFileDenied, 403),
    (SandboxFileExists, 409),
    (SandboxDiskFull, 507),
    (SandboxFileError, 400),
    # the store's
    (RecordNotFound, 404),
    (RecordExists, 409),
    (StoreError, 503),
)
"""Domain error -> HTTP status: the one place statuses are chosen."""


def status_for(exc: BaseException) -> int:
    """The HTTP status of a domain error; 500 for anything else."""
    if isinstance(exc, NoNodeAvailable) and exc.full:
        return 429  # every node at its REPLGATE_MAX_KERNELS: a limit, as one machine's pool
    for kind, status in STATUS_BY_ERROR:
        if isinstance(exc, kind):
            return status
    if is_database_error(exc):
        return _database_status(exc)
    return 500


def detail_for(exc: BaseException) -> Any:
    """The ``detail`` of an error answer: the error's own sentence (or validation list)."""
    if isinstance(exc, GatewayError):
        return exc.detail
    if is_database_error(exc):
        return _database_detail(exc)
    return str(exc)


_DISK_FULL = "53100"
"""PostgreSQL's SQLSTATE disk_full."""


DATABASE_AWAY = (DBAPIError, PoolTimeout, OSError)
"""What a database out of reach for a moment (a restart, a failover) raises: a write or a poll
in the background tries again after it."""


def is_database_error(exc: BaseException) -> bool:
    """The database failed (SQLite's or PostgreSQL's driver, SQLAlchemy's wrapper of their
    errors, its pool out of connections): the gateway's state is out of reach, not a bug."""
    return isinstance(exc, sqlite3.Error | DBAPIError | PoolTimeout)


def _database_status(exc: BaseException) -> int:
    cause = exc.orig if isinstance(exc, DBAPIError) else exc
    if getattr(cause, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
        return 507
    return 507 if getattr(cause, "sqlstate", None) == _DISK_FULL else 503


def _database_detail(exc: BaseException) -> str:
    cause = exc.orig if isinstance(exc, DBAPIError) else exc
    if getattr(cause, "sqlstate", None) == _DISK_FULL:
        return ("the gateway's PostgreSQL database is out of disk space; free space on its "
                "server")
    if _database_status(exc) == 507:
        return ("the gateway's state directory is full (its database cannot grow); delete "
                "sessions or free disk space")
    return "the gateway's database is unavailable right now; retry in a few seconds"
