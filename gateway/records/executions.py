"""Execution history: each execution of a session, in the order the session ran them."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any, cast, get_args

from pydantic import BaseModel, Field, TypeAdapter
from sqlalchemy import RowMapping, text
from sqlalchemy.exc import IntegrityError

from common.database import Database, StoreError, Write
from common.store import RecordExists, RecordNotFound, Store, as_dict, utc_now
from kernel_pool import Event, Execution

__all__ = ["PENDING_APPROVAL", "RUNNING", "ExecutionRecord", "ExecutionRecords"]

RUNNING = "running"
"""The status of an execution the store has started and not yet finished."""
PENDING_APPROVAL = "pending_approval"
"""The status of an unfinished execution held until a person approves it (governance)."""

_EXECUTION_COLUMNS = (
    "id, session_id, tenant, seq, code, status, execution_count, events, result, "
    "started_at, finished_at"
)
_SEQ_TRIES = 20
"""How many times an execution's start takes the next seq after other gateways' took it."""


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


class ExecutionRecords(Store):
    """The store's execution history."""

    def __init__(self, database: Database) -> None:
        super().__init__(database)
        self._lookup: sqlite3.Connection | None = None
        """SQLite only: a plain connection for :meth:`execution_taken`, used on the event loop."""
        self._starts = asyncio.Lock()
        """Starts of executions take their seq in the order they were asked for (FIFO): the
        connection pool would otherwise run them in whichever order its threads get to."""

    async def close(self) -> None:
        if not self._closed and self._lookup is not None:
            self._lookup.close()
        await super().close()

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
            **as_dict(rows[0]), status=str(status), execution_count=execution_count,
            events=valid_events, result=valid_result)

    @staticmethod
    def execution_end(execution_id: str, status: str, execution_count: int | None,
                      events: Sequence[BaseModel | Mapping[str, Any]],
                      result: Execution | Mapping[str, Any] | None) -> Write:
        """:meth:`finish_execution`'s statement, to be committed with the execution's audit
        record (an unknown id then changes nothing, and raises nothing)."""
        return ExecutionRecords._execution_end(execution_id, status, execution_count, events,
                                               result)[0]

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


def _as_plain(value: BaseModel | Mapping[str, Any]) -> Any:
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else dict(value)


def _execution_from_row(row: RowMapping | sqlite3.Row) -> ExecutionRecord:
    data = as_dict(row)
    data["events"] = json.loads(data["events"])
    if data["result"] is not None:
        data["result"] = json.loads(data["result"])
    return ExecutionRecord.model_validate(data)
