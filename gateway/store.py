"""The store: sessions, execution history, hashed API keys, and the state governance and E2B
share between gateways (approvals, budgets' use, sandboxes' ends), in the gateway's database.

One :class:`Store` over one :class:`~common.database.Database`: SQLite in the state directory
(the embedded default) or PostgreSQL (``REPLGATE_DATABASE_URL``), with the same SQL for both.
Every method is a single statement on an autocommitting connection, so no transaction is ever
left open across an ``await`` for another coroutine's statements to join. The audit log
(:mod:`gateway.audit`) keeps its own tables in the same database, through
:attr:`Store.database`.

Rows come back as pydantic models (:class:`SessionRecord`, :class:`ExecutionRecord`) with their
JSON columns validated into models again. Timestamps are ISO 8601 UTC strings (:func:`utc_now`).

    async with Store.open(state_dir / "replgate.db") as store:
        await store.create_session(SessionRecord(id=..., tenant=..., profile="default"))
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import sqlite3
import time
from collections.abc import Generator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, cast, get_args

import aiosqlite
from pydantic import BaseModel, Field, TypeAdapter
from sqlalchemy import RowMapping, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import IntegrityError

from common.database import Database, StoreError, Write
from common.keys import hash_api_key
from gateway.wire import Approval
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
    "Usage",
    "stored_time",
    "utc_now",
]

logger = logging.getLogger(__name__)

KEYS_FRESH_S = 2.0
"""How long the API keys read from the database answer requests before they are read again."""
KEYS_READ_AHEAD_S = KEYS_FRESH_S / 2
"""Keys older than this still answer, and a request that finds them so has them read again in
the background: a gateway asked at least this often never waits for that read."""
RUNNING = "running"
"""The status of an execution the store has started and not yet finished."""
PENDING_APPROVAL = "pending_approval"
"""The status of an unfinished execution held until a person approves it (governance)."""

Usage = tuple[int, float, float]
"""What a session has used of its budgets: executions, wall-time seconds, CPU seconds."""

_SESSION_JSON_COLUMNS = ("metadata", "env", "sandbox")
_EXECUTION_COLUMNS = (
    "id, session_id, tenant, seq, code, status, execution_count, events, result, "
    "started_at, finished_at"
)


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

    def __init__(self, target: str | Path | URL) -> None:
        self._target = target
        self._store: Store | None = None

    def __await__(self) -> Generator[Any, None, Store]:
        return Store._connect(self._target).__await__()

    async def __aenter__(self) -> Store:
        self._store = await Store._connect(self._target)
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
    """Sessions, history and keys. Make one with :meth:`open`."""

    def __init__(self, database: Database) -> None:
        self._database = database
        self._closed = False
        self._lookup: sqlite3.Connection | None = None
        """SQLite only: a plain connection for :meth:`execution_taken`, used on the event loop."""
        self._starts = asyncio.Lock()
        """Starts of executions take their seq in the order they were asked for (FIFO): the
        connection pool would otherwise run them in whichever order its threads get to."""
        self._keys: tuple[tuple[str, str], ...] = ()
        self._keys_read_at = -math.inf
        self._keys_generation = 0
        """Raised by each key this store adds: a read begun before it is not kept as fresh."""
        self._keys_reading: asyncio.Task[object] | None = None

    @staticmethod
    def open(target: str | Path | URL) -> _StoreOpener:
        """Open the database ``target`` names and bring its schema up to date: a path (a SQLite
        file, made with its folder if needed) or a URL (``postgresql://...``, ``sqlite:///...``).

        Use ``async with Store.open(target) as store`` or ``store = await Store.open(target)``
        and later ``await store.close()``.
        """
        return _StoreOpener(target)

    @classmethod
    async def _connect(cls, target: str | Path | URL) -> Store:
        return cls(await Database.open(target))

    async def close(self) -> None:
        """Close the database's connections (idempotent)."""
        if not self._closed:
            self._closed = True
            if self._keys_reading is not None:
                self._keys_reading.cancel()
            if self._lookup is not None:
                self._lookup.close()
            await self._database.close()

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
        # The seq is computed inside the INSERT: one statement, committed on its own. Two
        # gateways sharing PostgreSQL may start executions of one session at once and compute
        # the same seq; the (session_id, seq) key refuses the later, which takes the next.
        # (The casts type the SELECT's parameters and NULLs, which PostgreSQL would otherwise
        # take for text.)
        insert = text(
            f"INSERT INTO executions ({_EXECUTION_COLUMNS}) SELECT CAST(:id AS TEXT), "
            "CAST(:session_id AS TEXT), CAST(:tenant AS TEXT), COALESCE(MAX(seq), 0) + 1, "
            "CAST(:code AS TEXT), CAST(:status AS TEXT), CAST(NULL AS INTEGER), '[]', "
            "CAST(NULL AS TEXT), CAST(:started_at AS TEXT), CAST(NULL AS TEXT) "
            "FROM executions WHERE session_id = :session_id RETURNING *")
        params = {"id": execution_id, "session_id": session_id, "tenant": tenant, "code": code,
                  "status": RUNNING, "started_at": utc_now()}
        async with self._starts:
            for _ in range(_SEQ_TRIES):
                try:
                    async with self._database.connect() as connection:
                        row = (await connection.execute(insert, params)).mappings().one()
                    break
                except IntegrityError as exc:
                    if (not self._database.shared
                            or await self.get_execution(execution_id) is not None):
                        raise RecordExists("execution", execution_id) from exc
            else:
                raise StoreError(f"execution {execution_id} found its session's next seq taken "
                                 f"{_SEQ_TRIES} times in a row by other gateways' starts")
        return _execution_from_row(row)

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
        write, valid_events, valid_result = self._execution_end(
            execution_id, status, execution_count, events, result)
        rows = await self._fetch(write.sql, **write.params)
        if not rows:
            raise RecordNotFound("execution", execution_id)
        # Built from what was just written, not parsed back from its JSON.
        return ExecutionRecord.model_construct(
            **_as_dict(rows[0]), status=str(status), execution_count=execution_count,
            events=valid_events, result=valid_result)

    @staticmethod
    def execution_end(execution_id: str, status: str, execution_count: int | None,
                      events: Sequence[BaseModel | Mapping[str, Any]],
                      result: Execution | Mapping[str, Any] | None) -> Write:
        """:meth:`finish_execution`'s statement, to be committed with the execution's audit
        record (an unknown id then changes nothing, and raises nothing)."""
        return Store._execution_end(execution_id, status, execution_count, events, result)[0]

    @staticmethod
    def _execution_end(execution_id: str, status: str, execution_count: int | None,
                       events: Sequence[BaseModel | Mapping[str, Any]],
                       result: Execution | Mapping[str, Any] | None,
                       ) -> tuple[Write, list[Event], Execution | None]:
        # Models are valid by construction: only plain values are validated.
        valid_events: list[Event] = (
            cast(list[Event], list(events)) if all(isinstance(e, _EVENT_TYPES) for e in events)
            else _EVENTS.validate_python([_as_plain(event) for event in events]))
        valid_result = (result if isinstance(result, Execution) or result is None
                        else Execution.model_validate(_as_plain(result)))
        write = Write(
            "UPDATE executions SET status = :status, execution_count = :count, "
            "events = :events, result = :result, finished_at = :finished WHERE id = :id "
            "RETURNING id, session_id, tenant, seq, code, started_at, finished_at",
            {"status": str(status), "count": execution_count,
             "events": _EVENTS.dump_json(valid_events).decode(),
             "result": None if valid_result is None else valid_result.model_dump_json(),
             "finished": utc_now(), "id": execution_id})
        return write, valid_events, valid_result

    def execution_taken(self, execution_id: str) -> bool | None:
        """Whether an execution has this id, answered on the calling thread (the event loop)
        from a SQLite file; None when the database is busy or not SQLite, and then
        :meth:`get_execution` answers.

        A lookup by primary key takes microseconds; a hop to a connection's thread costs a few
        hundred, and this sits on the path of every execution a client names itself. The
        lookup never waits for a lock (no busy timeout): under WAL readers do not need one.
        """
        path = self._database.sqlite_path
        if self._closed or path is None:
            return None
        try:
            if self._lookup is None:
                self._lookup = sqlite3.connect(path, timeout=0, isolation_level=None,
                                               check_same_thread=False)
                self._lookup.execute("PRAGMA query_only=ON")
            row = self._lookup.execute(
                "SELECT 1 FROM executions WHERE id = ?", (execution_id,)).fetchone()
        except sqlite3.Error:
            return None
        return row is not None

    async def get_execution(self, execution_id: str) -> ExecutionRecord | None:
        """The execution with that id, or None."""
        rows = await self._fetch("SELECT * FROM executions WHERE id = :id", id=execution_id)
        return _execution_from_row(rows[0]) if rows else None

    async def list_executions(self, session_id: str) -> list[ExecutionRecord]:
        """A session's executions in the order it ran them."""
        rows = await self._fetch(
            "SELECT * FROM executions WHERE session_id = :id ORDER BY seq", id=session_id)
        return [_execution_from_row(row) for row in rows]

    async def mark_unfinished_as(self, status: str, node: str | None = None) -> int:
        """Give every ``running`` (or ``pending_approval``) execution this status (at start-up,
        after a crash); only those of sessions of ``node`` (or of none) when given, so a
        gateway starting on a shared database leaves the others' running executions alone.

        Returns how many there were. Their events and result stay as they were (empty).
        """
        of_node = "" if node is None else (
            " AND session_id IN (SELECT id FROM sessions WHERE node = :node OR node IS NULL)")
        return await self._change(
            "UPDATE executions SET status = :status, finished_at = :now "
            f"WHERE status IN (:running, :pending){of_node}", status=str(status),
            now=utc_now(), running=RUNNING, pending=PENDING_APPROVAL, node=node)

    async def set_execution_status(self, execution_id: str, status: str) -> None:
        """Change an unfinished execution's status (``running`` <-> ``pending_approval``)."""
        await self._change(
            "UPDATE executions SET status = :status WHERE id = :id AND finished_at IS NULL",
            status=str(status), id=execution_id)

    # -- API keys -------------------------------------------------------------------------

    async def add_api_key(self, tenant: str, key: str) -> None:
        """Store a tenant's key, hashed. Adding the same pair again does nothing.

        Raises:
            ValueError: an empty tenant or key, or a key already given to another tenant.
        """
        if not tenant or not key:
            raise ValueError("an API key needs a non-empty tenant and key")
        key_hash = hash_api_key(key)
        await self._change(
            "INSERT INTO api_keys (key_hash, tenant, created_at) VALUES (:hash, :tenant, :now) "
            "ON CONFLICT DO NOTHING", hash=key_hash, tenant=tenant, now=utc_now())
        self._keys_read_at = -math.inf
        self._keys_generation += 1
        rows = await self._fetch("SELECT tenant FROM api_keys WHERE key_hash = :hash",
                                 hash=key_hash)
        if rows and rows[0]["tenant"] != tenant:
            raise ValueError(f"that API key already belongs to tenant {rows[0]['tenant']!r}")

    async def tenant_for_key(self, key: str) -> str | None:
        """The tenant owning this key, or None.

        Every stored hash is compared, each with ``hmac.compare_digest``, so the time taken
        does not depend on which key (if any) matched. Tenants have few keys; this is cheap.
        The keys are read from the database at most every :data:`KEYS_FRESH_S` (every request
        asks; a key another gateway adds is known here that much later), in the background
        once they are :data:`KEYS_READ_AHEAD_S` old.
        """
        candidate = hash_api_key(key)
        keys = self._keys
        age = time.monotonic() - self._keys_read_at
        if age > KEYS_FRESH_S:
            keys = await self._read_keys()
        elif age > KEYS_READ_AHEAD_S and self._keys_reading is None:
            self._keys_reading = asyncio.ensure_future(self._read_keys())
            self._keys_reading.add_done_callback(self._keys_read)
        found: str | None = None
        for key_hash, tenant in keys:
            if hmac.compare_digest(candidate, key_hash):
                found = tenant
        return found

    async def _read_keys(self) -> tuple[tuple[str, str], ...]:
        generation, began = self._keys_generation, time.monotonic()
        rows = await self._fetch("SELECT key_hash, tenant FROM api_keys")
        keys = tuple((str(row["key_hash"]), str(row["tenant"])) for row in rows)
        if generation == self._keys_generation:  # no key added meanwhile: keep it
            self._keys, self._keys_read_at = keys, began
        return keys

    def _keys_read(self, reading: asyncio.Task[object]) -> None:
        self._keys_reading = None
        if not reading.cancelled() and reading.exception() is not None:
            # The keys in hand answer until they are KEYS_FRESH_S old; a request then reads
            # them itself, and meets the error.
            logger.warning("could not read the API keys ahead: %s", reading.exception())

    async def list_tenants(self) -> list[str]:
        """Tenants that have at least one key, sorted."""
        rows = await self._fetch("SELECT DISTINCT tenant FROM api_keys ORDER BY tenant")
        return [str(row["tenant"]) for row in rows]


    # -- approvals (governance) -----------------------------------------------------------

    async def add_approval(self, approval: Approval) -> None:
        """Record a held execution's approval, pending."""
        row = approval.model_dump(mode="json")
        await self._change(
            "INSERT INTO approvals (id, tenant, session_id, execution_id, code, rules, status, "
            "created_at, expires_at) VALUES (:approval_id, :tenant, :session_id, "
            ":execution_id, :code, :rules, :status, :created_at, :expires_at)",
            **{name: row[name] for name in (
                "approval_id", "tenant", "session_id", "execution_id", "code", "status",
                "created_at", "expires_at")},
            rules=json.dumps(row["rules"], separators=(",", ":")))

    async def get_approval(self, approval_id: str) -> Approval | None:
        """The approval with that id, pending or decided, or None."""
        rows = await self._fetch("SELECT * FROM approvals WHERE id = :id", id=approval_id)
        return _approval_from_row(rows[0]) if rows else None

    async def pending_approvals(self, tenant: str, now: str) -> list[Approval]:
        """The tenant's approvals still pending and not past their expiry, oldest first."""
        rows = await self._fetch(
            "SELECT * FROM approvals WHERE tenant = :tenant AND status = 'pending' "
            "AND expires_at > :now ORDER BY created_at, id", tenant=tenant, now=now)
        return [_approval_from_row(row) for row in rows]

    async def close_approval(self, approval_id: str, status: str, at: str, *,
                             by: str | None = None, comment: str | None = None,
                             tenant: str | None = None) -> Approval | None:
        """Decide a pending approval (``approved``, ``rejected``, ``expired``, ``withdrawn``)
        and return it; None when it is not pending (decided first elsewhere), not the
        tenant's, or (for a person's decision) past its expiry. One statement, so of two
        gateways deciding at once one wins."""
        person = status in ("approved", "rejected")
        rows = await self._fetch(
            "UPDATE approvals SET status = :status, decided_by = :by, decided_at = :at, "
            "comment = :comment WHERE id = :id AND status = 'pending'"
            + (" AND tenant = :tenant" if tenant is not None else "")
            + (" AND expires_at > :at" if person else "") + " RETURNING *",
            status=status, by=by, at=at, comment=comment, id=approval_id, tenant=tenant)
        return _approval_from_row(rows[0]) if rows else None

    async def decided_approvals(self, approval_ids: Sequence[str]) -> list[Approval]:
        """Those of the approvals named that are no longer pending."""
        if not approval_ids:
            return []
        listed, names = _in_list(approval_ids)
        rows = await self._fetch(
            f"SELECT * FROM approvals WHERE id IN ({listed}) AND status <> 'pending'", **names)
        return [_approval_from_row(row) for row in rows]

    # -- budgets' use (governance) --------------------------------------------------------

    async def session_usage(self, session_id: str) -> Usage:
        """What the session has used of its budgets: (executions, wall s, CPU s)."""
        rows = await self._fetch("SELECT executions, wall_s, cpu_s FROM session_usage "
                                 "WHERE session_id = :id", id=session_id)
        return _usage(rows[0]) if rows else (0, 0.0, 0.0)

    async def add_session_usage(self, session_id: str, executions: int, wall_s: float,
                                cpu_s: float) -> Usage:
        """Add to what the session has used, atomically; the totals after."""
        rows = await self._fetch(_ADD_USAGE + _RETURNING_USAGE, id=session_id,
                                 executions=executions, wall_s=wall_s, cpu_s=cpu_s)
        return _usage(rows[0])

    async def claim_execution(self, session_id: str, runs: int, wall_s: float, cpu_s: float,
                              *, max_executions: int | None, max_wall_s: float | None,
                              max_cpu_s: float | None) -> Usage | None:
        """Add one execution (and ``runs``, ``wall_s`` and ``cpu_s`` not saved yet) to the
        session's use, unless a limit given is used up: the totals after, or None (and nothing
        changed). One statement, so that of gateways claiming at once no more pass than the
        limits allow."""
        limits = {"max_executions": max_executions, "max_wall_s": max_wall_s,
                  "max_cpu_s": max_cpu_s}
        used_up = {
            "max_executions": "session_usage.executions + excluded.executions > :max_executions",
            "max_wall_s": "session_usage.wall_s + excluded.wall_s >= :max_wall_s",
            "max_cpu_s": "session_usage.cpu_s + excluded.cpu_s >= :max_cpu_s"}
        given = {name: value for name, value in limits.items() if value is not None}
        unless = (" WHERE NOT (" + " OR ".join(used_up[name] for name in given) + ")"
                  if given else "")
        rows = await self._fetch(
            _ADD_USAGE + unless + _RETURNING_USAGE,
            id=session_id, executions=runs + 1, wall_s=wall_s, cpu_s=cpu_s, **given)
        return _usage(rows[0]) if rows else None

    # -- E2B sandboxes' ends --------------------------------------------------------------

    async def set_sandbox_end(self, session_id: str, tenant: str, end_at: str | None, *,
                              later_only: bool = False) -> None:
        """The E2B sandbox ends at ``end_at`` (None: it does not, paused by its SDK);
        ``later_only`` keeps an end already later."""
        keep = (" WHERE e2b_sandboxes.end_at IS NULL OR e2b_sandboxes.end_at < excluded.end_at"
                if later_only else "")
        await self._change(
            "INSERT INTO e2b_sandboxes (session_id, tenant, end_at) VALUES (:id, :tenant, :end) "
            "ON CONFLICT (session_id) DO UPDATE SET end_at = excluded.end_at" + keep,
            id=session_id, tenant=tenant, end=end_at)

    async def sandbox_ends(self, session_ids: Sequence[str]) -> dict[str, str | None]:
        """The recorded ends of those sandboxes that have one (None: paused by its SDK)."""
        if not session_ids:
            return {}
        listed, names = _in_list(session_ids)
        rows = await self._fetch(
            f"SELECT session_id, end_at FROM e2b_sandboxes WHERE session_id IN ({listed})",
            **names)
        return {str(row["session_id"]): row["end_at"] for row in rows}

    async def due_sandboxes(self, now: str) -> list[tuple[str, str, str]]:
        """(session, tenant, end) of the sandboxes whose end has come."""
        rows = await self._fetch("SELECT session_id, tenant, end_at FROM e2b_sandboxes "
                                 "WHERE end_at <= :now ORDER BY end_at", now=now)
        return [(str(row["session_id"]), str(row["tenant"]), str(row["end_at"]))
                for row in rows]

    async def claim_sandbox(self, session_id: str, seen_end: str, until: str) -> bool:
        """Take the ending of a sandbox whose end was ``seen_end``, moving its end to
        ``until`` (another gateway tries again then, if this one does not finish); False
        when another gateway took it, or its end moved, first."""
        return bool(await self._change(
            "UPDATE e2b_sandboxes SET end_at = :until WHERE session_id = :id "
            "AND end_at = :seen", until=until, id=session_id, seen=seen_end))

    async def drop_sandbox(self, session_id: str) -> None:
        """Forget a sandbox's end (it was killed, or its session is gone)."""
        await self._change("DELETE FROM e2b_sandboxes WHERE session_id = :id", id=session_id)

    async def next_sandbox_end(self) -> str | None:
        """The earliest end of any sandbox, or None."""
        rows = await self._fetch("SELECT MIN(end_at) AS end_at FROM e2b_sandboxes")
        value = rows[0]["end_at"] if rows else None
        return None if value is None else str(value)


def _as_dict(row: RowMapping | sqlite3.Row) -> dict[str, Any]:
    return dict(zip(row.keys(), tuple(row), strict=True)) if isinstance(row, sqlite3.Row) \
        else dict(row)


def _as_plain(value: BaseModel | Mapping[str, Any]) -> Any:
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else dict(value)


def _session_row(record: SessionRecord) -> dict[str, Any]:
    row = record.model_dump(mode="json")
    for name in _SESSION_JSON_COLUMNS:
        row[name] = None if row[name] is None else json.dumps(row[name], separators=(",", ":"))
    row["deleted"] = int(record.deleted)
    return row


def _session_from_row(row: RowMapping | sqlite3.Row) -> SessionRecord:
    data = _as_dict(row)
    for name in _SESSION_JSON_COLUMNS:
        if data[name] is not None:
            data[name] = json.loads(data[name])
    return SessionRecord.model_validate(data)


def _execution_from_row(row: RowMapping | sqlite3.Row) -> ExecutionRecord:
    data = _as_dict(row)
    data["events"] = json.loads(data["events"])
    if data["result"] is not None:
        data["result"] = json.loads(data["result"])
    return ExecutionRecord.model_validate(data)


def _in_list(values: Sequence[str]) -> tuple[str, dict[str, str]]:
    """An ``IN (...)`` list of named parameters for ``values`` (not empty), and their values."""
    names = {f"v{index}": value for index, value in enumerate(values)}
    return ", ".join(":" + name for name in names), names


def _approval_from_row(row: RowMapping | sqlite3.Row) -> Approval:
    data = _as_dict(row)
    data["approval_id"] = data.pop("id")
    data["rules"] = json.loads(data["rules"])
    return Approval.model_validate(data)


_ADD_USAGE = (
    "INSERT INTO session_usage (session_id, executions, wall_s, cpu_s) "
    "VALUES (:id, :executions, :wall_s, :cpu_s) ON CONFLICT (session_id) DO UPDATE "
    "SET executions = session_usage.executions + excluded.executions, "
    "wall_s = session_usage.wall_s + excluded.wall_s, "
    "cpu_s = session_usage.cpu_s + excluded.cpu_s")
"""Add to a session's use (a claim adds its ``WHERE`` condition after it)."""
_RETURNING_USAGE = " RETURNING executions, wall_s, cpu_s"
_SEQ_TRIES = 20
"""How many times an execution's start takes the next seq after other gateways' took it."""


def _usage(row: RowMapping | sqlite3.Row) -> Usage:
    return int(row["executions"]), float(row["wall_s"]), float(row["cpu_s"])
