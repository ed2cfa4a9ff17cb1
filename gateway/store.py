"""The embedded store: sessions, execution history and hashed API keys in one SQLite file.

One :class:`Store` owns one ``aiosqlite`` connection (SQLite runs on aiosqlite's thread, never
on the event loop), in WAL mode and autocommit: every method is a single statement, so no
transaction is ever left open across an ``await`` for another coroutine's statements to join.
The audit log (:mod:`gateway.audit`) keeps its own table in the same file, through
:attr:`Store.connection`.

Rows come back as pydantic models (:class:`SessionRecord`, :class:`ExecutionRecord`) with their
JSON columns validated into models again. Timestamps are ISO 8601 UTC strings (:func:`utc_now`).

    async with Store.open(state_dir / "replgate.db") as store:
        await store.create_session(SessionRecord(id=..., tenant=..., profile="default"))
"""

from __future__ import annotations

import hmac
import json
import sqlite3
from collections.abc import Generator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, cast, get_args

import aiosqlite
import anyio.to_thread
from pydantic import BaseModel, Field, TypeAdapter

from gateway.auth import hash_api_key
from kernel_pool import Event, Execution, SandboxInfo

__all__ = [
    "PENDING_APPROVAL",
    "RUNNING",
    "ExecutionRecord",
    "RecordExists",
    "RecordNotFound",
    "SessionRecord",
    "Store",
    "StoreError",
    "utc_now",
]

SCHEMA_VERSION = 1
RUNNING = "running"
"""The status of an execution the store has started and not yet finished."""
PENDING_APPROVAL = "pending_approval"
"""The status of an unfinished execution held until a person approves it (governance)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    profile TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at TEXT NOT NULL,
    last_active_at TEXT NOT NULL,
    execution_count INTEGER NOT NULL,
    metadata TEXT NOT NULL,
    env TEXT NOT NULL,
    sandbox TEXT,
    deleted INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS sessions_tenant ON sessions (tenant, deleted);
CREATE TABLE IF NOT EXISTS executions (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    seq INTEGER NOT NULL,
    code TEXT NOT NULL,
    status TEXT NOT NULL,
    execution_count INTEGER,
    events TEXT NOT NULL,
    result TEXT,
    started_at TEXT NOT NULL,
    finished_at TEXT,
    UNIQUE (session_id, seq)
);
CREATE INDEX IF NOT EXISTS executions_status ON executions (status);
CREATE TABLE IF NOT EXISTS api_keys (
    key_hash TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    created_at TEXT NOT NULL
);
"""

_SESSION_JSON_COLUMNS = ("metadata", "env", "sandbox")
_EXECUTION_COLUMNS = (
    "id, session_id, tenant, seq, code, status, execution_count, events, result, "
    "started_at, finished_at"
)


def utc_now() -> str:
    """The current time as an ISO 8601 UTC string, in kernel_pool's format
    (``2024-05-01T12:00:00.123456+00:00``), so stored and live timestamps compare."""
    return datetime.now(UTC).isoformat()


class StoreError(Exception):
    """Base of the store's errors."""


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


class ExecutionRecord(BaseModel):
    """One execution in a session's history, in the order the session ran them (``seq``)."""

    id: str
    session_id: str
    tenant: str
    seq: int = Field(ge=1)
    code: str
    status: str
    """``running`` while in flight, then an ``ExecutionStatus`` value (or ``interrupted``
    for one a crashed gateway left running)."""
    execution_count: int | None = None
    events: list[Event] = Field(default_factory=list)
    result: Execution | None = None
    started_at: str
    finished_at: str | None = None


_EVENTS: TypeAdapter[list[Event]] = TypeAdapter(list[Event])
_EVENT_TYPES = tuple(get_args(get_args(Event)[0]))
"""The event models (``Event`` is an annotated union of them)."""


class _StoreOpener:
    """What :meth:`Store.open` returns: awaitable, and an async context manager that closes."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._store: Store | None = None

    def __await__(self) -> Generator[Any, None, Store]:
        return Store._connect(self._path).__await__()

    async def __aenter__(self) -> Store:
        self._store = await Store._connect(self._path)
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
    """The gateway's SQLite database. Make one with :meth:`open`."""

    def __init__(self, db: aiosqlite.Connection, path: Path,
                 reader: aiosqlite.Connection | None = None) -> None:
        self._db = db
        self._reader = reader or db
        """Reads that sit on a request's path (its key, an execution id's check, the history)
        go to this second connection: under WAL they never queue behind the writer's commits."""
        self._path = path
        self._closed = False
        self._lookup: sqlite3.Connection | None = None
        """A plain connection for :meth:`execution_taken`, used on the event loop."""

    @staticmethod
    def open(path: str | Path) -> _StoreOpener:
        """Open (creating if needed) the database at ``path``, and its parent folder.

        Use ``async with Store.open(path) as store`` or ``store = await Store.open(path)`` and
        later ``await store.close()``.
        """
        return _StoreOpener(Path(path))

    @classmethod
    async def _connect(cls, path: Path) -> Store:
        await anyio.to_thread.run_sync(lambda: path.parent.mkdir(parents=True, exist_ok=True))
        # isolation_level=None: autocommit, see the module docstring.
        db = await aiosqlite.connect(path, isolation_level=None)
        try:
            db.row_factory = aiosqlite.Row
            await db.execute("PRAGMA journal_mode=WAL")
            # NORMAL: commits are not synced one by one (the WAL stays consistent; a process
            # crash loses nothing). The audit log commits each record it appends with
            # synchronous=FULL, before its head names it: a record, and the history
            # written before it, are on disk then; a power cut can lose only what followed.
            await db.execute("PRAGMA synchronous=NORMAL")
            await db.execute("PRAGMA busy_timeout=5000")
            async with db.execute("PRAGMA user_version") as cursor:
                row = await cursor.fetchone()
            version = int(row[0]) if row else 0
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"database {path} has schema version {version}, newer than this replgate's "
                    f"{SCHEMA_VERSION}; upgrade replgate or use another REPLGATE_STATE_DIR"
                )
            await db.executescript(
                f"BEGIN; {_SCHEMA} PRAGMA user_version={SCHEMA_VERSION}; COMMIT;"
            )
            reader = await aiosqlite.connect(path, isolation_level=None)
        except BaseException:
            await db.close()
            raise
        try:
            reader.row_factory = aiosqlite.Row
            await reader.execute("PRAGMA query_only=ON")
            await reader.execute("PRAGMA busy_timeout=5000")
        except BaseException:
            await reader.close()
            await db.close()
            raise
        return cls(db, path, reader)

    async def close(self) -> None:
        """Close the connection (idempotent)."""
        if not self._closed:
            self._closed = True
            if self._lookup is not None:
                self._lookup.close()
            try:
                if self._reader is not self._db:
                    await self._reader.close()
            finally:
                await self._db.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    @property
    def connection(self) -> aiosqlite.Connection:
        """The one connection, shared with the audit log so the file has a single writer."""
        return self._db

    def __repr__(self) -> str:
        return f"<Store {str(self._path)!r}{' closed' if self._closed else ''}>"

    # -- sessions -------------------------------------------------------------------------

    async def create_session(self, record: SessionRecord) -> SessionRecord:
        """Insert a new session; :class:`RecordExists` if its id is taken."""
        row = _session_row(record)
        columns = ", ".join(row)
        marks = ", ".join("?" * len(row))
        try:
            await self._db.execute_fetchall(
                f"INSERT INTO sessions ({columns}) VALUES ({marks})", tuple(row.values())
            )
        except sqlite3.IntegrityError as exc:
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
        assignments = ", ".join(f"{name} = ?" for name in fields)
        rows = await self._db.execute_fetchall(
            f"UPDATE sessions SET {assignments} WHERE id = ? RETURNING *",
            (*(row[name] for name in fields), session_id),
        )
        if not rows:
            raise RecordNotFound("session", session_id)
        return _session_from_row(next(iter(rows)))

    async def record_activity(self, session_id: str, *, execution_count: int,
                              last_active_at: str, sandbox: SandboxInfo | None) -> None:
        """After each execution: the session's count, last activity and sandbox, in one UPDATE
        (:meth:`update_session` without its read and validation, for the hot path)."""
        sandbox_json = None if sandbox is None else json.dumps(
            sandbox.model_dump(mode="json"), separators=(",", ":"))
        await self._db.execute_fetchall(
            "UPDATE sessions SET execution_count = ?, last_active_at = ?, sandbox = ? "
            "WHERE id = ?", (execution_count, last_active_at, sandbox_json, session_id))

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session with that id (deleted or not), or None."""
        async with self._reader.execute("SELECT * FROM sessions WHERE id = ?",
                                        (session_id,)) as cur:
            row = await cur.fetchone()
        return None if row is None else _session_from_row(row)

    async def list_sessions(
        self, tenant: str | None = None, include_deleted: bool = False
    ) -> list[SessionRecord]:
        """Sessions, oldest first; of one tenant if given; deleted ones only when asked."""
        clauses: list[str] = []
        params: list[Any] = []
        if tenant is not None:
            clauses.append("tenant = ?")
            params.append(tenant)
        if not include_deleted:
            clauses.append("deleted = 0")
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = await self._reader.execute_fetchall(
            f"SELECT * FROM sessions {where} ORDER BY created_at, id", params
        )
        return [_session_from_row(row) for row in rows]

    async def mark_deleted(self, session_id: str) -> None:
        """Flag a session deleted; its row and history stay. :class:`RecordNotFound` if none."""
        async with self._db.execute(
            "UPDATE sessions SET deleted = 1 WHERE id = ?", (session_id,)
        ) as cursor:
            changed = cursor.rowcount
        if changed == 0:
            raise RecordNotFound("session", session_id)

    # -- executions -----------------------------------------------------------------------

    async def start_execution(
        self, execution_id: str, session_id: str, tenant: str, code: str
    ) -> ExecutionRecord:
        """Record an execution as ``running``, next in its session's order.

        Raises:
            RecordExists: the id is taken.
            ValueError: the code is not encodable text (a lone surrogate from a JSON escape);
                the gateway should refuse such code before it gets here.
        """
        try:
            code.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"code is not valid Unicode text: {exc.reason}") from exc
        # The seq is computed inside the INSERT, so two starts can never take the same one.
        try:
            rows = await self._db.execute_fetchall(
                f"INSERT INTO executions ({_EXECUTION_COLUMNS}) "
                "SELECT ?, ?, ?, COALESCE(MAX(seq), 0) + 1, ?, ?, NULL, '[]', NULL, ?, NULL "
                "FROM executions WHERE session_id = ? RETURNING *",
                (execution_id, session_id, tenant, code, RUNNING, utc_now(), session_id),
            )
        except sqlite3.IntegrityError as exc:
            raise RecordExists("execution", execution_id) from exc
        return _execution_from_row(next(iter(rows)))

    async def finish_execution(
        self,
        execution_id: str,
        status: str,
        execution_count: int | None,
        events: Sequence[BaseModel | Mapping[str, Any]],
        result: Execution | Mapping[str, Any] | None,
    ) -> ExecutionRecord:
        """Record how an execution ended: its status, count, events (in order) and aggregate.

        Events and result are validated before they are written (pydantic models or their
        ``model_dump(mode="json")`` dicts). :class:`RecordNotFound` if the id is unknown.
        """
        # Models are valid by construction: only plain values are validated.
        valid_events: list[Event] = (
            cast(list[Event], list(events)) if all(isinstance(e, _EVENT_TYPES) for e in events)
            else _EVENTS.validate_python([_as_plain(event) for event in events]))
        valid_result = (result if isinstance(result, Execution) or result is None
                        else Execution.model_validate(_as_plain(result)))
        rows = await self._db.execute_fetchall(
            "UPDATE executions SET status = ?, execution_count = ?, events = ?, result = ?, "
            "finished_at = ? WHERE id = ? RETURNING id, session_id, tenant, seq, code, "
            "started_at, finished_at",
            (str(status), execution_count, _EVENTS.dump_json(valid_events).decode(),
             None if valid_result is None else valid_result.model_dump_json(), utc_now(),
             execution_id),
        )
        if not rows:
            raise RecordNotFound("execution", execution_id)
        row = next(iter(rows))
        # Built from what was just written, not parsed back from its JSON.
        return ExecutionRecord.model_construct(
            **dict(zip(row.keys(), tuple(row), strict=True)), status=str(status),
            execution_count=execution_count, events=valid_events, result=valid_result)

    def execution_taken(self, execution_id: str) -> bool | None:
        """Whether an execution has this id, answered on the calling thread (the event loop);
        None when the database is busy, and then :meth:`get_execution` answers.

        A lookup by primary key takes microseconds; a hop to a connection's thread costs a few
        hundred, and this sits on the path of every execution a client names itself. The
        lookup never waits for a lock (no busy timeout): under WAL readers do not need one.
        """
        if self._closed:
            return None
        try:
            if self._lookup is None:
                self._lookup = sqlite3.connect(self._path, timeout=0, isolation_level=None,
                                               check_same_thread=False)
                self._lookup.execute("PRAGMA query_only=ON")
            row = self._lookup.execute(
                "SELECT 1 FROM executions WHERE id = ?", (execution_id,)).fetchone()
        except sqlite3.Error:
            return None
        return row is not None

    async def get_execution(self, execution_id: str) -> ExecutionRecord | None:
        """The execution with that id, or None."""
        async with self._reader.execute(
            "SELECT * FROM executions WHERE id = ?", (execution_id,)
        ) as cursor:
            row = await cursor.fetchone()
        return None if row is None else _execution_from_row(row)

    async def list_executions(self, session_id: str) -> list[ExecutionRecord]:
        """A session's executions in the order it ran them."""
        rows = await self._reader.execute_fetchall(
            "SELECT * FROM executions WHERE session_id = ? ORDER BY seq", (session_id,)
        )
        return [_execution_from_row(row) for row in rows]

    async def mark_unfinished_as(self, status: str) -> int:
        """Give every ``running`` (or ``pending_approval``) execution this status (at start-up,
        after a crash).

        Returns how many there were. Their events and result stay as they were (empty).
        """
        async with self._db.execute(
            "UPDATE executions SET status = ?, finished_at = ? WHERE status IN (?, ?)",
            (str(status), utc_now(), RUNNING, PENDING_APPROVAL),
        ) as cursor:
            return cursor.rowcount

    async def set_execution_status(self, execution_id: str, status: str) -> None:
        """Change an unfinished execution's status (``running`` <-> ``pending_approval``)."""
        await self._db.execute_fetchall(
            "UPDATE executions SET status = ? WHERE id = ? AND finished_at IS NULL",
            (str(status), execution_id),
        )

    # -- API keys -------------------------------------------------------------------------

    async def add_api_key(self, tenant: str, key: str) -> None:
        """Store a tenant's key, hashed. Adding the same pair again does nothing.

        Raises:
            ValueError: an empty tenant or key, or a key already given to another tenant.
        """
        if not tenant or not key:
            raise ValueError("an API key needs a non-empty tenant and key")
        key_hash = hash_api_key(key)
        await self._db.execute_fetchall(
            "INSERT OR IGNORE INTO api_keys (key_hash, tenant, created_at) VALUES (?, ?, ?)",
            (key_hash, tenant, utc_now()),
        )
        async with self._db.execute(
            "SELECT tenant FROM api_keys WHERE key_hash = ?", (key_hash,)
        ) as cursor:
            row = await cursor.fetchone()
        if row is not None and row["tenant"] != tenant:
            raise ValueError(f"that API key already belongs to tenant {row['tenant']!r}")

    async def tenant_for_key(self, key: str) -> str | None:
        """The tenant owning this key, or None.

        Every stored hash is compared, each with ``hmac.compare_digest``, so the time taken
        does not depend on which key (if any) matched. Tenants have few keys; this is cheap.
        """
        candidate = hash_api_key(key)
        rows = await self._reader.execute_fetchall("SELECT key_hash, tenant FROM api_keys")
        found: str | None = None
        for row in rows:
            if hmac.compare_digest(candidate, row["key_hash"]):
                found = row["tenant"]
        return found

    async def list_tenants(self) -> list[str]:
        """Tenants that have at least one key, sorted."""
        rows = await self._reader.execute_fetchall(
            "SELECT DISTINCT tenant FROM api_keys ORDER BY tenant"
        )
        return [str(row["tenant"]) for row in rows]


def _as_plain(value: BaseModel | Mapping[str, Any]) -> Any:
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else dict(value)


def _session_row(record: SessionRecord) -> dict[str, Any]:
    row = record.model_dump(mode="json")
    for name in _SESSION_JSON_COLUMNS:
        row[name] = None if row[name] is None else json.dumps(row[name], separators=(",", ":"))
    row["deleted"] = int(record.deleted)
    return row


def _session_from_row(row: sqlite3.Row) -> SessionRecord:
    data = dict(zip(row.keys(), tuple(row), strict=True))
    for name in _SESSION_JSON_COLUMNS:
        if data[name] is not None:
            data[name] = json.loads(data[name])
    return SessionRecord.model_validate(data)


def _execution_from_row(row: sqlite3.Row) -> ExecutionRecord:
    data = dict(zip(row.keys(), tuple(row), strict=True))
    data["events"] = json.loads(data["events"])
    if data["result"] is not None:
        data["result"] = json.loads(data["result"])
    return ExecutionRecord.model_validate(data)
