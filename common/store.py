"""The store's core: the database opened and migrated, one statement per call, and the
sessions' records the gateway and the node both keep.

One :class:`Store` over one :class:`~common.database.Database`: SQLite in the state directory
(the embedded default) or PostgreSQL (``REPLGATE_DATABASE_URL``), with the same SQL for both.
Every method is a single statement on an autocommitting connection, so no transaction is ever
left open across an ``await`` for another coroutine's statements to join. The gateway's store
(:mod:`gateway.store`) adds its records to this one (executions, keys, approvals, budgets' use,
E2B sandboxes' ends); the audit log (:mod:`gateway.audit`) keeps its own tables in the same
database, through :attr:`Store.database`.

Rows come back as pydantic models (:class:`SessionRecord`) with their JSON columns validated
into models again. Timestamps are ISO 8601 UTC strings (:func:`utc_now`).

    async with Store.open(state_dir / "replgate.db") as store:
        await store.create_session(SessionRecord(id=..., tenant=..., profile="default"))
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Generator
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, Self, TypeVar, cast

import aiosqlite
from pydantic import BaseModel, Field
from sqlalchemy import RowMapping, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import IntegrityError

from common.database import Database, StoreError, Write
from kernel_pool import NetworkPolicy, SandboxInfo

__all__ = [
    "RecordExists",
    "RecordNotFound",
    "SessionRecord",
    "Store",
    "as_dict",
    "stored_time",
    "utc_now",
]

_SESSION_JSON_COLUMNS = ("metadata", "env", "sandbox", "network")


def utc_now() -> str:
    """The current time as an ISO 8601 UTC string, in kernel_pool's format
    (``2024-05-01T12:00:00.123456+00:00``), so stored and live timestamps compare."""
    return datetime.now(UTC).isoformat()


def stored_time(moment: datetime) -> str:
    """A time as the store keeps it: ISO 8601, always with microseconds (the database compares
    these times as text)."""
    return moment.isoformat(timespec="microseconds")


class RecordNotFound(StoreError, LookupError):
    """No row of that kind has that id."""

    def __init__(self, kind: str, record_id: str) -> None:
        self.kind = kind
        self.record_id = record_id
        super().__init__(f"no {kind} {record_id!r} in the store")


class RecordExists(StoreError):
    """A row of that kind already has that id."""

    def __init__(self, kind: str, record_id: str) -> None:
        self.kind = kind
        self.record_id = record_id
        super().__init__(f"{kind} {record_id!r} already exists in the store")


class SessionRecord(BaseModel):
    """A session's row: what the gateway needs to list it and to take it back after a restart."""

    id: str
    tenant: str
    profile: str
    status: str = "starting"
    created_at: str = Field(default_factory=utc_now)
    last_active_at: str = Field(default_factory=utc_now)
    execution_count: int = Field(default=0, ge=0)
    metadata: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    sandbox: SandboxInfo | None = None
    """The sandbox it runs in, for re-adoption; None before it has one or after deletion."""
    deleted: bool = False
    node: str | None = None
    """The node running it (``replgate node``); None in one process, while paused, or before
    it is placed."""
    epoch: int = Field(default=0, ge=0)
    """Raised by each new placement: a node holding an older one no longer owns the session."""
    network: NetworkPolicy | None = None
    """Its network policy (None: its profile's), applied again wherever it is taken back."""


_S = TypeVar("_S", bound="Store")


class _StoreOpener(Generic[_S]):
    """What :meth:`Store.open` returns: awaitable, and an async context manager that closes."""

    def __init__(self, kind: type[_S], target: str | Path | URL) -> None:
        self._kind = kind
        self._target = target
        self._store: _S | None = None

    def __await__(self) -> Generator[Any, None, _S]:
        return self._kind._connect(self._target).__await__()

    async def __aenter__(self) -> _S:
        self._store = await self._kind._connect(self._target)
        return self._store

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._store is not None:
            await self._store.close()


class Store:
    """Sessions' records, over a database. Make one with :meth:`open`."""

    def __init__(self, database: Database) -> None:
        self._database = database
        self._closed = False

    @classmethod
    def open(cls, target: str | Path | URL) -> _StoreOpener[Self]:
        """Open the database ``target`` names and bring its schema up to date: a path (a SQLite
        file, made with its folder if needed) or a URL (``postgresql://...``, ``sqlite:///...``).

        Use ``async with Store.open(target) as store`` or ``store = await Store.open(target)``
        and later ``await store.close()``.
        """
        return _StoreOpener(cls, target)

    @classmethod
    async def _connect(cls, target: str | Path | URL) -> Self:
        return cls(await Database.open(target))

    async def close(self) -> None:
        """Close the database's connections (idempotent)."""
        if not self._closed:
            self._closed = True
            await self._database.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def database(self) -> Database:
        """The database, shared with the audit log."""
        return self._database

    @property
    def path(self) -> Path | None:
        """The SQLite file, or None on PostgreSQL."""
        return self._database.sqlite_path

    def __repr__(self) -> str:
        return f"<Store {self._database!r}{' closed' if self._closed else ''}>"

    async def _fetch(self, sql: str, /, **params: Any,
                     ) -> list[RowMapping] | list[sqlite3.Row]:
        """The statement's rows (it commits on its own)."""
        async with self._database.connect() as own:
            if self._database.dialect == "sqlite":
                # One hop to aiosqlite's thread (SQLAlchemy's cursor takes four: open,
                # execute, fetch, close), with the same named parameters: this is on every
                # request's path (its key).
                driver = cast(aiosqlite.Connection,
                              (await own.get_raw_connection()).driver_connection)
                return list(await driver.execute_fetchall(sql, params))
            result = await own.execute(text(sql), params)
            return list(result.mappings()) if result.returns_rows else []

    async def _change(self, sql: str, /, **params: Any) -> int:
        """Run a statement that returns no rows (it commits on its own); how many rows it
        changed."""
        async with self._database.connect() as own:
            return (await own.execute(text(sql), params)).rowcount

    # -- sessions -------------------------------------------------------------------------

    async def create_session(self, record: SessionRecord) -> SessionRecord:
        """Insert a new session; :class:`RecordExists` if its id is taken."""
        row = _session_row(record)
        columns = ", ".join(row)
        marks = ", ".join(f":{name}" for name in row)
        try:
            await self._change(f"INSERT INTO sessions ({columns}) VALUES ({marks})", **row)
        except IntegrityError as exc:
            raise RecordExists("session", record.id) from exc
        return record

    async def update_session(self, session_id: str, **fields: Any) -> SessionRecord:
        """Set some of a session's fields and return the updated record.

        Values are validated as :class:`SessionRecord` fields; only the named columns are
        written, so concurrent updates of different fields do not undo each other.

        Raises:
            ValueError: an unknown field, ``id``, or an invalid value.
            RecordNotFound: no such session.
        """
        unknown = set(fields) - (set(SessionRecord.model_fields) - {"id"})
        if unknown:
            raise ValueError(f"cannot update session field(s) {', '.join(sorted(unknown))}")
        current = await self.get_session(session_id)
        if current is None:
            raise RecordNotFound("session", session_id)
        if not fields:
            return current
        updated = SessionRecord.model_validate({**current.model_dump(), **fields})
        row = _session_row(updated)
        assignments = ", ".join(f"{name} = :{name}" for name in fields)
        rows = await self._fetch(
            f"UPDATE sessions SET {assignments} WHERE id = :session_id RETURNING *",
            **{name: row[name] for name in fields}, session_id=session_id)
        if not rows:
            raise RecordNotFound("session", session_id)
        return _session_from_row(rows[0])

    @staticmethod
    def activity(session_id: str, *, execution_count: int, last_active_at: str,
                 sandbox: SandboxInfo | None) -> Write:
        """After each execution: the session's count, last activity and sandbox, in one UPDATE
        (:meth:`update_session` without its read and validation, for the hot path), to be
        committed with the execution's audit record."""
        sandbox_json = None if sandbox is None else json.dumps(
            sandbox.model_dump(mode="json"), separators=(",", ":"))
        return Write("UPDATE sessions SET execution_count = :count, last_active_at = :active, "
                     "sandbox = :sandbox WHERE id = :id",
                     {"count": execution_count, "active": last_active_at,
                      "sandbox": sandbox_json, "id": session_id})

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session with that id (deleted or not), or None."""
        rows = await self._fetch("SELECT * FROM sessions WHERE id = :id", id=session_id)
        return _session_from_row(rows[0]) if rows else None

    async def list_sessions(
        self, tenant: str | None = None, include_deleted: bool = False,
        node: str | None = None,
    ) -> list[SessionRecord]:
        """Sessions, oldest first; of one tenant if given; deleted ones only when asked; of
        one node if given (with those of none: rows from before sessions had a node)."""
        clauses: list[str] = []
        if tenant is not None:
            clauses.append("tenant = :tenant")
        if not include_deleted:
            clauses.append("deleted = 0")
        if node is not None:
            clauses.append("(node = :node OR node IS NULL)")
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = await self._fetch(f"SELECT * FROM sessions {where} ORDER BY created_at, id",
                                 tenant=tenant, node=node)
        return [_session_from_row(row) for row in rows]

    async def count_sessions(self, tenant: str) -> int:
        """How many live sessions the tenant has."""
        rows = await self._fetch("SELECT COUNT(*) AS n FROM sessions WHERE tenant = :tenant "
                                 "AND deleted = 0", tenant=tenant)
        return int(rows[0]["n"])

    async def mark_deleted(self, session_id: str) -> None:
        """Flag a session deleted; its row and history stay. :class:`RecordNotFound` if none."""
        if not await self._change("UPDATE sessions SET deleted = 1 WHERE id = :id",
                                  id=session_id):
            raise RecordNotFound("session", session_id)


def as_dict(row: RowMapping | sqlite3.Row) -> dict[str, Any]:
    """A row of either driver (SQLite's one-hop reads, SQLAlchemy's mappings) as a dict."""
    return dict(zip(row.keys(), tuple(row), strict=True)) if isinstance(row, sqlite3.Row) \
        else dict(row)


def _session_row(record: SessionRecord) -> dict[str, Any]:
    row = record.model_dump(mode="json")
    for name in _SESSION_JSON_COLUMNS:
        row[name] = None if row[name] is None else json.dumps(row[name], separators=(",", ":"))
    row["deleted"] = int(record.deleted)
    return row


def _session_from_row(row: RowMapping | sqlite3.Row) -> SessionRecord:
    data = as_dict(row)
    for name in _SESSION_JSON_COLUMNS:
        if data[name] is not None:
            data[name] = json.loads(data[name])
    return SessionRecord.model_validate(data)
