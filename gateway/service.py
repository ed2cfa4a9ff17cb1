"""The gateway's use cases: tenants' sessions on the pool, recorded in the store and audit log.

Routers call this and nothing below it; it is the one place that knows which tenant owns which
session, records every execution (history for notebooks and reconnects, hash-chained audit)
and enforces per-tenant limits.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from opentelemetry import trace

from common.metrics import Metrics
from common.settings import Settings
from common.store import SessionRecord
from common.tracing import Tracing
from gateway.admission import Admissions, Ticket
from gateway.audit import AuditLog
from gateway.audit_records import AuditRecord
from gateway.errors import (
    InvalidInput,
    NotFound,
    TooManyRequests,
    Unauthorized,
)
from gateway.governance import Governance
from gateway.network import attach, check_network
from gateway.notebook import NotebookCell, build_notebook
from gateway.profiles import TemplateProfiles
from gateway.recording import UNRECORDED_REFUSED, Recorder
from gateway.records.executions import ExecutionRecord
from gateway.store import Store
from gateway.usage import UsageMeter
from gateway.wire import (
    CommandRequest,
    ExecutionOut,
    ForkRequest,
    SessionCreate,
    SessionMetricsOut,
    SessionOut,
    TransferOut,
)
from kernel_pool import (
    CommandResult,
    EgressAttempt,
    Execution,
    ExecutionHandle,
    ExecutionIdTaken,
    FileInfo,
    NodeRecord,
    PayloadTooLarge,
    Profile,
    SessionHost,
    SessionNotFound,
    SessionPort,
    SessionStatus,
    StateDirFull,
    StreamEvent,
    UnknownNode,
    parse_size,
)

logger = logging.getLogger(__name__)



class Gateway:
    """Everything a request may ask of replgate, per tenant."""

    def __init__(self, settings: Settings, pool: SessionHost, store: Store, audit: AuditLog,
                 metrics: Metrics, governance: Governance | None = None,
                 tracing: Tracing | None = None) -> None:
        self.settings = settings
        self.pool = pool
        """Where sessions are made and found: this process's pool (one machine), or the
        nodes of many (``app.py`` chooses; the gateway asks both the same)."""
        self.store = store
        self.audit = audit
        self.metrics = metrics
        self.governance = governance or Governance(store)
        """Policy, approvals and budgets: the gate every execution passes first."""
        self.tracing = tracing
        """Spans for executions and lifecycle requests; None when no exporter is set up (then
        nothing here touches OpenTelemetry)."""
        self.usage = UsageMeter()
        self.templates: TemplateProfiles | None = None
        """Set by :mod:`gateway.templates`: the profile a tenant's name stands for, or refused."""
        self._tenant_of: dict[str, str] = {}
        self._creating = Admissions()
        """The sessions this gateway recorded or found, with their tenants (the host decides
        whose a session is: this is what the per-tenant limits count)."""
        self.recorder = Recorder(store, audit, metrics, self.governance, tracing,
                                 image=settings.limits.image,
                                 max_unrecorded=settings.max_unrecorded_executions)
        """Every execution's history and audit records (the image they name gets its digest
        once :func:`gateway.adoption.take_back` has looked it up)."""
        pool.on_session_closed.append(self._closed_by_pool)
        pool.on_session_closed.append(self.governance.forget)
        pool.on_session_paused.append(self._lifecycle_changed)
        pool.on_session_resumed.append(self._lifecycle_changed)

    # -- tenants -----------------------------------------------------------------------------

    async def authenticate(self, token: str | None) -> str:
        tenant = await self.store.tenant_for_key(token) if token else None
        if tenant is None:
            raise Unauthorized("missing or wrong API key: send 'Authorization: Bearer <key>'")
        return tenant

    async def session(self, tenant: str, session_id: str) -> SessionPort:
        """The tenant's live session; another tenant's is exactly as absent as a missing one.

        On many machines the shared database says whether it exists and where it runs (another
        gateway may have created, deleted or placed it again), and its node is reached with
        the connection this gateway keeps.
        """
        try:
            session = await self.pool.find(session_id, tenant=tenant)
        except SessionNotFound:
            if session_id not in self.pool.sessions:  # deleted, or placed nowhere
                self._tenant_of.pop(session_id, None)
            raise
        self._tenant_of[session_id] = tenant
        return session

    async def owner(self, session_id: str) -> str | None:
        """The tenant of a live session, for a caller that proved its right to it otherwise
        (the E2B sandbox plane authenticates by a per-sandbox token, not by an API key)."""
        tenant = self._tenant_of.get(session_id)
        if tenant is None:
            tenant = await self.pool.tenant_of(session_id)
        return tenant

    def profiles(self) -> list[Profile]:
        """The sandbox profiles sessions may be created with."""
        return list(self.pool.settings.profiles.values())

    async def sessions(self, tenant: str) -> list[SessionPort]:
        """The tenant's live sessions (on many machines: wherever they run)."""
        found = list(await self.pool.list_sessions(tenant))
        for session in found:
            self._tenant_of[session.id] = tenant
        return found

    async def _admit(self, tenant: str, ticket: Ticket) -> None:
        """Refuse a new session to a tenant that holds its most (with its creates before it)."""
        ahead = ticket.ahead()  # first: one made meanwhile is counted twice, never not at all
        if await self.pool.count_sessions(tenant) + ahead >= self.settings.max_sessions_per_tenant:
            raise TooManyRequests(
                f"tenant {tenant!r} already has {self.settings.max_sessions_per_tenant} sessions; "
                "delete some or raise REPLGATE_MAX_SESSIONS_PER_TENANT")

    def _local_sessions(self, tenant: str) -> list[SessionPort]:
        """The tenant's sessions this process holds."""
        return [s for sid, s in self.pool.sessions.items() if self._tenant_of.get(sid) == tenant]

    def describe(self, session: SessionPort) -> SessionOut:
        state = session.state()
        paused = state.pause_info if state.status is SessionStatus.PAUSED else None
        return SessionOut(
            id=session.id, tenant=self._tenant_of.get(session.id, ""),
            profile=session.profile.name, status=state.status.value,
            execution_count=state.execution_count, created_at=state.created_at,
            last_active_at=state.last_active_at, metadata=state.metadata,
            budget=self.governance.budget(self._tenant_of.get(session.id, ""), session),
            paused_with=paused.paused_with if paused else None,
            not_kept=paused.not_kept if paused else None,
            snapshot_bytes=paused.image_bytes if paused else None, reason=state.reason,
            transfer=TransferOut.model_validate(state.transfer.model_dump())
            if state.transfer is not None else None,
            node=None if state.status is SessionStatus.PAUSED else state.node)

    # -- sessions ----------------------------------------------------------------------------

    async def create_session(self, tenant: str, request: SessionCreate,
                             session_id: str | None = None) -> SessionPort:
        self.check_disk()
        profile = self.pool.profile(request.profile if self.templates is None
                                    else await self.templates.profile_for(tenant, request.profile))
        if request.network is not None:
            check_network(profile, request.network)  # a 403 before any kernel is claimed
        if request.timeout_s is not None and request.timeout_s > profile.max_timeout_s:
            raise InvalidInput(f"timeout_s must be at most {profile.max_timeout_s:g} "
                               f"for profile {profile.name!r}")
        loop = asyncio.get_running_loop()
        started = loop.time()
        # The tenant's sessions are counted beside the host's own work (on nodes: while a
        # node's slot is claimed in the shared database): a round trip less in every create.
        ticket = self._creating.enter(tenant)
        admitted = asyncio.ensure_future(self._admit(tenant, ticket))
        try:
            session = await self.pool.create_session(
                profile.name, env=request.env, metadata=request.metadata,
                session_id=session_id, tenant=tenant, admitted=admitted)
        finally:
            ticket.done()
            if not admitted.done():
                admitted.cancel()
            elif not admitted.cancelled():
                admitted.exception()  # (retrieved: raised by the create, or moot)
        await attach(self.pool, session, request.network)
        self.metrics.acquire.observe(loop.time() - started)
        if request.timeout_s is not None:
            session.profile = profile.model_copy(update={"default_timeout_s": request.timeout_s})
        self._tenant_of[session.id] = tenant
        state = session.state()
        await self.store.create_session(SessionRecord(
            id=session.id, tenant=tenant, profile=profile.name, status=state.status.value,
            created_at=state.created_at, last_active_at=state.last_active_at,
            execution_count=0, metadata=request.metadata, env=request.env,
            sandbox=state.sandbox.model_dump(mode="json"), node=state.node,
            epoch=self.pool.first_epoch, network=request.network))
        return session

    def took_back(self, session_id: str, tenant: str) -> None:
        """A session a previous gateway left in this machine's pool is the tenant's again
        (:func:`gateway.adoption.take_back`)."""
        self._tenant_of[session_id] = tenant

    async def delete_session(self, tenant: str, session_id: str) -> None:
        await self.session(tenant, session_id)
        await self.pool.delete_session(session_id)

    def _closed_by_pool(self, session: SessionPort, reason: str) -> None:
        self.usage.forget(session.id)
        if self._tenant_of.pop(session.id, None) is None:
            return  # never recorded: a copy of a fork that failed
        task = asyncio.get_running_loop().create_task(self.store.mark_deleted(session.id))
        task.add_done_callback(_log_failure)

    # -- pause, resume, fork -----------------------------------------------------------------

    async def pause(self, tenant: str, session_id: str) -> SessionPort:
        """Keep the session in a snapshot and free its kernel (waits for running code)."""
        session = await self.session(tenant, session_id)
        self.check_disk()
        with self._span("replgate.pause", tenant, session_id):
            await session.pause()
        await self._record_lifecycle(session)
        return session

    async def resume(self, tenant: str, session_id: str) -> SessionPort:
        session = await self.session(tenant, session_id)
        with self._span("replgate.resume", tenant, session_id):
            await session.resume()
        await self._record_lifecycle(session)
        return session

    async def fork(self, tenant: str, session_id: str, request: ForkRequest) -> list[SessionPort]:
        """New sessions of the tenant with the session's variables and workspace files."""
        await self.session(tenant, session_id)
        self.check_disk()
        held = await self.pool.count_sessions(tenant)
        if held + request.count > self.settings.max_sessions_per_tenant:
            raise TooManyRequests(
                f"tenant {tenant!r} has {held} sessions; {request.count} more would pass "
                f"REPLGATE_MAX_SESSIONS_PER_TENANT={self.settings.max_sessions_per_tenant}")
        with self._span("replgate.fork", tenant, session_id) as span:
            children: list[SessionPort] = list(await self.pool.fork_session(
                session_id, request.count, request.metadata))
            span.set_attribute("replgate.fork.count", len(children))
        for child in children:
            self._tenant_of[child.id] = tenant
            state = child.state()
            await self.store.create_session(SessionRecord(
                id=child.id, tenant=tenant, profile=child.profile.name,
                status=state.status.value, created_at=state.created_at,
                last_active_at=state.last_active_at, execution_count=0,
                metadata=state.metadata, env=state.env,
                sandbox=state.sandbox.model_dump(mode="json"), node=state.node,
                epoch=self.pool.first_epoch, network=state.network))
        return children

    def _span(self, name: str, tenant: str,
              session_id: str) -> AbstractContextManager[trace.Span]:
        if self.tracing is None:
            return nullcontext(trace.INVALID_SPAN)
        return self.tracing.lifecycle(name, tenant, session_id)

    async def session_metrics(self, tenant: str, session_id: str) -> SessionMetricsOut:
        """The sandbox's CPU, memory and disk use now (see :class:`UsageMeter`)."""
        return await self.usage.read(await self.session(tenant, session_id))

    async def _record_lifecycle(self, session: SessionPort) -> None:
        """The store learns the session's status and sandbox (a resume makes a container)."""
        state = session.state()
        await self.store.update_session(session.id, status=state.status.value,
                                        sandbox=state.sandbox.model_dump(mode="json"))

    def _lifecycle_changed(self, session: SessionPort) -> None:
        """A pause or resume the pool made: the store learns the session's new sandbox."""
        if session.id in self._tenant_of:
            task = asyncio.get_running_loop().create_task(self._record_lifecycle(session))
            task.add_done_callback(_log_failure)

    async def restart(self, tenant: str, session_id: str) -> SessionPort:
        session = await self.session(tenant, session_id)
        with self._span("replgate.restart", tenant, session_id):
            await session.restart()
        await self.store.update_session(session.id, execution_count=0,
                                        last_active_at=session.state().last_active_at)
        return session

    # -- executions --------------------------------------------------------------------------

    async def check_new_execution_id(self, execution_id: str | None) -> None:
        """A client-chosen execution id must be new: it names the execution in the history."""
        if execution_id is None:
            return
        taken = self.recorder.live(execution_id) or self.store.execution_taken(execution_id)
        if taken is None:  # the database was busy: ask it the usual way
            taken = await self.store.get_execution(execution_id) is not None
        if taken:
            raise ExecutionIdTaken(execution_id)

    def check_disk(self) -> None:
        """507 when the state directory is nearly full: nothing runs that cannot be recorded
        (history, audit), and no workspace is made that would not fit."""
        free = shutil.disk_usage(self.settings.state_dir).free
        if free < parse_size(self.settings.state_min_free):
            raise StateDirFull(free, f"under REPLGATE_STATE_MIN_FREE="
                               f"{self.settings.state_min_free}); delete sessions or free disk "
                               "space")

    def submit(self, tenant: str, session: SessionPort, code: str, timeout_s: float | None,
               execution_id: str | None = None,
               trace_context: Mapping[str, str] | None = None, *,
               language: str | None = None, context_id: str | None = None) -> ExecutionHandle:
        """Queue code on the tenant's session; it is recorded and audited when it ends.

        A client-chosen ``execution_id`` must have passed :meth:`check_new_execution_id`.
        ``trace_context`` (W3C ``traceparent``/``tracestate``) names the trace its span
        joins, when not the current one (a WebSocket carries one per execution). The code runs
        in the code context ``context_id`` names, else in ``language``'s default one (both
        None: Python's own kernel).
        """
        try:
            size = len(code.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidInput("code is not valid Unicode text (a lone surrogate?)") from None
        if size > self.settings.max_code_bytes:
            raise PayloadTooLarge("code", self.settings.max_code_bytes,
                                  "; put large data in a file instead")
        if execution_id is not None and self.recorder.live(execution_id):
            raise ExecutionIdTaken(execution_id)
        self.check_disk()
        behind = self.recorder.unrecorded()
        if behind >= UNRECORDED_REFUSED * self.settings.max_unrecorded_executions:
            raise TooManyRequests(
                f"the gateway has {behind} finished executions still to record (history, "
                "audit); wait for them (REPLGATE_MAX_UNRECORDED_EXECUTIONS)")
        running = sum(s.pending for s in self._local_sessions(tenant))
        if running >= self.settings.max_concurrent_executions_per_tenant:
            raise TooManyRequests(
                f"tenant {tenant!r} has {running} executions queued or running, the limit; "
                "wait for some to finish")
        span = (self.tracing.start_execution(tenant, session.id, code, trace_context)
                if self.tracing is not None else None)
        try:
            # Under the span: a node's execution (its call from a task made here) is its child.
            with (nullcontext() if span is None else trace.use_span(
                    span, end_on_exit=False, record_exception=False,
                    set_status_on_exception=False)):
                handle = session.submit(code, timeout_s, execution_id=execution_id,
                                        gate=self.governance.gate(tenant, session),
                                        language=language, context_id=context_id)
        except BaseException as exc:
            if span is not None:
                Tracing.refused(span, exc)
            raise
        if span is not None:
            Tracing.submitted(span, handle)
        self.recorder.follow(tenant, session, handle, span)
        return handle

    def live_executions(self, session_id: str) -> list[ExecutionHandle]:
        """The session's submitted executions whose finished record is not yet in the history,
        in submission order (a watcher replays them from their handles)."""
        return self.recorder.live_executions(session_id)

    async def execute(self, tenant: str, session: SessionPort, code: str,
                      timeout_s: float | None, *, language: str | None = None,
                      context_id: str | None = None) -> ExecutionOut:
        handle = self.submit(tenant, session, code, timeout_s, language=language,
                             context_id=context_id)
        execution = await self.recorded(handle)
        return ExecutionOut(id=handle.id, **execution.model_dump())

    async def recorded(self, handle: ExecutionHandle) -> Execution:
        """The execution's result once it has finished, and so is in the history
        (:meth:`Recorder.recorded`)."""
        return await self.recorder.recorded(handle)

    # -- shell commands ----------------------------------------------------------------------

    async def run_command(self, tenant: str, session: SessionPort, request: CommandRequest,
                          emit: Callable[[StreamEvent], None] | None = None,
                          on_start: Callable[[], None] | None = None) -> CommandResult:
        """Run a shell command beside the session's kernel; audited like code. ``on_start``
        is called once :meth:`kill_command` reaches it."""
        self.check_disk()
        result = await session.run_command(request.cmd, timeout_s=request.timeout_s,
                                           env=request.env, cwd=request.cwd,
                                           command_id=request.id, emit=emit, on_start=on_start,
                                           stdin=request.stdin, pty=request.pty)
        record = AuditRecord.for_command(
            result, command=request.cmd, tenant=tenant, session_id=session.id,
            image=self.recorder.image,
            limits=session.profile.model_dump(mode="json", exclude={"caps"}))
        # written even when the caller has gone away meanwhile: what ran is on the record
        await asyncio.shield(self.audit.append(record))
        return result

    async def kill_command(self, session: SessionPort, command_id: str) -> bool:
        """Stop a running command of the session; False when none runs under that id."""
        return await session.kill_command(command_id)

    # -- history, notebook, files ------------------------------------------------------------

    async def history(self, tenant: str, session_id: str) -> list[ExecutionRecord]:
        """The session's executions in order, each finished one with its result, including
        those submitted or finished a moment ago whose record the store has not written yet
        (a client told "pending approval" or "done" finds them here at once)."""
        await self.session(tenant, session_id)
        return await self.recorder.history(tenant, session_id)

    async def notebook(self, tenant: str, session_id: str) -> dict[str, Any]:
        session = await self.session(tenant, session_id)
        records = await self.history(tenant, session_id)
        cells = [NotebookCell(code=r.code, execution_count=r.execution_count,
                              events=[e.model_dump(mode="json") for e in r.events],
                              status=r.status) for r in records]
        return build_notebook(
            {"id": session.id, "tenant": tenant, "profile": session.profile.name,
             "created_at": session.state().created_at}, cells)

    async def write_file(self, tenant: str, session_id: str, path: str, data: bytes) -> int:
        session = await self.session(tenant, session_id)
        if len(data) > self.settings.max_upload_bytes:
            raise upload_too_large(self.settings.max_upload_bytes)
        return await session.write_file(path, data)

    async def read_file(self, tenant: str, session_id: str, path: str) -> bytes:
        return await (await self.session(tenant, session_id)).read_file(
            path, self.settings.max_download_bytes)

    async def list_files(self, tenant: str, session_id: str) -> list[FileInfo]:
        return await (await self.session(tenant, session_id)).list_files()

    async def egress_attempts(self, tenant: str, session_id: str) -> list[EgressAttempt]:
        return await (await self.session(tenant, session_id)).egress_attempts()

    async def interrupt(self, tenant: str, session_id: str) -> bool:
        return await (await self.session(tenant, session_id)).interrupt()

    # -- nodes ---------------------------------------------------------------------------------

    async def refresh(self, session: SessionPort) -> SessionPort:
        """The session with its state as its node has it now (a session on another machine
        may have run code through another gateway since this one last heard of it)."""
        await session.refresh()
        return session

    async def nodes(self) -> list[NodeRecord]:
        """The nodes sessions run on: on one machine, this gateway's own process."""
        return await self.pool.nodes()

    async def set_draining(self, node_id: str, draining: bool) -> NodeRecord:
        """Take a node out of service (no new sessions; its sessions paused) or back in
        (one machine: :class:`~kernel_pool.NotDrainable`)."""
        try:
            return await self.pool.drain(node_id, draining)
        except UnknownNode:
            raise NotFound(f"no node {node_id!r}; GET /v1/nodes lists them") from None

    # -- shutdown ----------------------------------------------------------------------------

    async def drain(self) -> None:
        """Let in-flight recordings finish so nothing that ran goes unaudited."""
        await self.recorder.drain()


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("background store update failed: %s", task.exception())


def upload_too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge("upload", limit)
