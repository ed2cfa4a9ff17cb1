"""Executions recorded: each one's history record and audit record, written off its
caller's path.

:class:`Recorder` follows every execution the gateway submits, from its start to its end,
into the store (history for notebooks and reconnects) and the hash-chained audit log; until
that is written, its handle stands in for it (:meth:`Recorder.history`, watchers). A write
the database cannot take for a moment is tried again (:data:`RECORD_RETRY_S`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from opentelemetry import trace

from common.metrics import Metrics
from common.store import RecordExists
from common.tracing import Tracing
from gateway.audit import AuditLog
from gateway.audit_records import AuditRecord
from gateway.errors import DATABASE_AWAY
from gateway.governance import Governance
from gateway.records.executions import PENDING_APPROVAL, RUNNING, ExecutionRecord
from gateway.store import Store
from kernel_pool import Execution, ExecutionHandle, SessionPort

logger = logging.getLogger(__name__)

UNRECORDED_REFUSED = 4
"""New executions are refused at this many times ``max_unrecorded_executions`` (those of
streams and channels, whose answers do not wait for their records)."""
RECORD_RETRY_S = 60.0
"""How long the recording of an execution that ran waits for the database to come back."""


class Recorder:
    """The gateway's executions on their way into the history and the audit log."""

    def __init__(self, store: Store, audit: AuditLog, metrics: Metrics, governance: Governance,
                 tracing: Tracing | None, *, image: str, max_unrecorded: int) -> None:
        self.store = store
        self.audit = audit
        self.metrics = metrics
        self.governance = governance
        self.tracing = tracing
        self.image = image
        """The sandbox image the audit records name, with its digest once known."""
        self.max_unrecorded = max_unrecorded
        """Beyond this many finished executions still to record, an answer waits for its own
        records (``REPLGATE_MAX_UNRECORDED_EXECUTIONS``)."""
        self._recorders: dict[str, asyncio.Task[Execution]] = {}
        self._live: dict[str, tuple[str, ExecutionHandle]] = {}
        """Submitted executions whose recording (history, then audit) is not over: watchers
        catch up from them, and the history shows the finished ones before the store has them."""

    def follow(self, tenant: str, session: SessionPort, handle: ExecutionHandle,
               span: trace.Span | None) -> None:
        """Record the execution just submitted, as it runs and when it ends."""
        task = asyncio.get_running_loop().create_task(
            self._record(tenant, session, handle, span))
        self._recorders[handle.id] = task
        self._live[handle.id] = (session.id, handle)
        task.add_done_callback(lambda _t: self._recorders.pop(handle.id, None))
        task.add_done_callback(lambda _t: self._live.pop(handle.id, None))

    def live(self, execution_id: str) -> bool:
        """Whether that execution is submitted and not yet recorded."""
        return execution_id in self._live

    def live_executions(self, session_id: str) -> list[ExecutionHandle]:
        """The session's submitted executions whose finished record is not yet in the history,
        in submission order (a watcher replays them from their handles)."""
        return [handle for sid, handle in self._live.values() if sid == session_id]

    async def recorded(self, handle: ExecutionHandle) -> Execution:
        """The execution's result once it has finished, and so is in the history.

        :meth:`history` shows a finished execution from its handle until the store has it, so
        a client told "done" finds it there at once without waiting for the database; the
        store and the audit record are written right after, off the caller's path, and
        ``drain`` waits for them at shutdown. Unless more than
        ``max_unrecorded_executions`` are still to be written: then the answer waits for its
        own records too (a gateway under more load than its database takes).
        """
        execution = await handle.result()
        recorder = self._recorders.get(handle.id)
        if recorder is not None and \
                self.unrecorded() > self.max_unrecorded:
            await asyncio.wait([recorder])  # (a recording that fails is logged, not raised)
        return execution

    def unrecorded(self) -> int:
        """Executions finished whose records are still to be written."""
        return sum(handle.done is not None for _, handle in self._live.values())

    async def _record(self, tenant: str, session: SessionPort, handle: ExecutionHandle,
                      span: trace.Span | None = None) -> Execution:
        if span is None:
            return await self._record_execution(tenant, session, handle)
        # Its recording (the store's statements, the audit) is the execution's work too.
        with trace.use_span(span, end_on_exit=False, record_exception=False,
                            set_status_on_exception=False):
            try:
                return await self._record_execution(tenant, session, handle, span)
            finally:
                if span.is_recording():  # not ended with its marks: the recording failed
                    span.end()

    async def _record_execution(self, tenant: str, session: SessionPort, handle: ExecutionHandle,
                                span: trace.Span | None = None) -> Execution:
        await self._durably(f"execution {handle.id}'s start", self._start_record, handle.id,
                            session.id, tenant, handle.code)
        try:
            await self.governance.follow(handle, self.store)  # pending_approval in history
            execution = await handle.result()
            # Counted as it ends, in the loop turn that answers its caller: a client told
            # "done" finds it in /metrics at once, not after the writes below (an fsync).
            self.metrics.observe(execution)
            await _behind_the_callers()
            if span is not None and self.tracing is not None:
                self.tracing.end_execution(span, handle, execution)
        except BaseException:
            execution = handle.execution()
            await self._durably(f"execution {handle.id}'s end", self.store.finish_execution,
                                handle.id, execution.status.value, execution.execution_count,
                                handle.events, execution)
            raise
        execution = handle.execution()
        state = session.state()

        # Its end, the session's activity and the audit record: one commit (on PostgreSQL,
        # one statement).
        await self._durably(f"execution {handle.id}'s end and audit record", self.audit.append,
                            AuditRecord.for_execution(
                                tenant=tenant, session_id=session.id, execution_id=handle.id,
                                code=handle.code, execution=execution, image=self.image,
                                limits=session.profile.model_dump(mode="json",
                                                                  exclude={"caps"}),
                                extra=self.governance.audit_extra(handle.id)),
                            writes=[
                                self.store.execution_end(
                                    handle.id, execution.status.value,
                                    execution.execution_count, handle.events, execution),
                                self.store.activity(
                                    session.id, execution_count=state.execution_count,
                                    last_active_at=state.last_active_at,
                                    sandbox=state.sandbox)])
        return execution

    async def _start_record(self, execution_id: str, session_id: str, tenant: str,
                            code: str) -> None:
        try:
            await self.store.start_execution(execution_id, session_id, tenant, code)
        except RecordExists:
            # Written by a try the database answered too late (it was restarting): it is there.
            if (await self.store.get_execution(execution_id)) is None:
                raise

    async def _durably(self, what: str, write: Callable[..., Awaitable[Any]], *args: Any,
                       **kwargs: Any) -> None:
        """A recording write, tried again for up to :data:`RECORD_RETRY_S` while the database
        is away (a restart, a failover): what ran stays in the history and the audit log
        through a moment's outage. (An audit append whose commit the database made but did
        not confirm is written twice: the chain stays whole, with the record twice.)"""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RECORD_RETRY_S
        delay = 0.1
        while True:
            try:
                await write(*args, **kwargs)
                return
            except DATABASE_AWAY as exc:
                if loop.time() + delay > deadline:
                    raise
                logger.warning("%s not recorded yet, the database is away (%s); trying again",
                               what, type(exc).__name__)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def history(self, tenant: str, session_id: str) -> list[ExecutionRecord]:
        """The session's executions in order, each finished one with its result, including
        those submitted or finished a moment ago whose record the store has not written yet
        (a client told "pending approval" or "done" finds them here at once)."""
        # Taken before the store is read: one that leaves ``_live`` meanwhile is stored by then.
        live = {handle.id: handle for sid, handle in list(self._live.values())
                if sid == session_id}
        records = await self.store.list_executions(session_id)
        if not live:
            return records
        for index, record in enumerate(records):
            handle = live.pop(record.id, None)
            if handle is None or record.finished_at is not None:
                continue
            if handle.done is not None:
                records[index] = _finished(record, handle)
            else:  # held or let through a moment ago: the store's row may not say so yet
                records[index] = record.model_copy(update={"status": _unfinished_status(handle)})
        for handle in live.values():  # submitted before the store heard of it
            record = ExecutionRecord(
                id=handle.id, session_id=session_id, tenant=tenant,
                seq=records[-1].seq + 1 if records else 1, code=handle.code,
                status=_unfinished_status(handle), events=list(handle.events),
                started_at=handle.started_at)
            records.append(record if handle.done is None else _finished(record, handle))
        return records

    async def drain(self) -> None:
        """Let in-flight recordings finish so nothing that ran goes unaudited."""
        for task in list(self._recorders.values()):
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(task), 10)


def _finished(record: ExecutionRecord, handle: ExecutionHandle) -> ExecutionRecord:
    """The history record of a finished execution, from its handle."""
    execution = handle.execution()
    return record.model_copy(update={
        "status": execution.status.value, "execution_count": execution.execution_count,
        "events": list(handle.events), "result": execution,
        "finished_at": handle.finished_at})


def _unfinished_status(handle: ExecutionHandle) -> str:
    """``pending_approval`` while the handle waits for a person's decision, else ``running``."""
    held = [e.type for e in handle.events if e.type in ("pending_approval", "approval")]
    return PENDING_APPROVAL if held and held[-1] == "pending_approval" else RUNNING


async def _behind_the_callers() -> None:
    """Wait until the tasks the execution's end woke with this one (a socket's forwarder, a
    request's handler: the callers' answers) have run. This task woke first, and what follows
    (its span, the records' statements) would otherwise delay every answer: a timer due now
    fires only after everything already ready, and after what that made ready (the socket's
    sender)."""
    loop = asyncio.get_running_loop()
    behind = loop.create_future()
    loop.call_soon(loop.call_later, 0, _resolve, behind)
    await behind


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
