"""The gateway's side of the port: sessions that run on a node, reached over mutual TLS.

A :class:`RemoteSession` is a :class:`~kernel_pool.SessionPort` whose every call is a request to
its node; its executions get a handle on the gateway's side, fed by the node's stream of events,
so history, audit, watchers and tracing read it as they read a local one. Approvals and policy
hold an execution here, before it is sent: the node's queue only ever holds code that may run.
While anyone listens to a session's transfers (a session socket, a watcher), the session
follows its node's stream of what happens to it: pauses' and resumes' progress, and the
executions other gateways submitted, which its listeners then hear as a local session's do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from pydantic import TypeAdapter

from kernel_pool import (
    DEFAULT_CONTEXT,
    ContextInfo,
    ContextNotFound,
    DoneEvent,
    ExecutionHandle,
    ExecutionQueue,
    ExecutionStatus,
    Gate,
    InvalidRequest,
    KernelPoolError,
    Listener,
    NodeUnreachable,
    PauseInfo,
    Profile,
    QueueFull,
    SandboxInfo,
    SessionClosed,
    SessionNotFound,
    SessionState,
    SessionStatus,
    TransferListener,
    check_language,
    normalize_language,
)
from node.client import NodeClient
from node.remote_files import SessionRequests
from node.sandbox_fs import RemoteSandboxFs
from node.wire import (
    CreateContext,
    Frame,
    Interrupted,
    Relay,
    Submit,
    error_from,
)

logger = logging.getLogger(__name__)

_CONTEXTS = TypeAdapter(list[ContextInfo])


FOLLOW_AGAIN_S = 1.0
"""The wait before a session's events are followed again after the stream broke."""


class _Followed(list["TransferListener"]):
    """A session's transfer listeners, which tell it when their number changes."""

    def __init__(self, changed: Callable[[], None]) -> None:
        super().__init__()
        self._changed = changed

    def append(self, listener: TransferListener) -> None:
        super().append(listener)
        self._changed()

    def remove(self, listener: TransferListener) -> None:
        super().remove(listener)
        self._changed()


class RemoteSession(SessionRequests, RemoteSandboxFs):
    """A session that runs on a node (see the module's docstring)."""

    def __init__(self, client: NodeClient, state: SessionState, *, tenant: str = "",
                 max_queued: int | None = None) -> None:
        self.client = client
        self.max_queued = max_queued
        """Executions it holds here (queued or running) before it refuses the next, as its
        node would (``max_queued_executions``; None: its node alone decides)."""
        self.tenant = tenant
        """The tenant its host found it for (a node older than the port's ``tenant`` sends
        none)."""
        self._queue = ExecutionQueue(self)
        """Its executions here, held by their gate until the node queues them."""
        self.listeners: list[Listener] = self._queue.listeners
        self.transfer_listeners: list[TransferListener] = _Followed(self._follow_or_not)
        self._following: asyncio.Task[None] | None = None
        self.followed = asyncio.Event()
        """Set while the session's events on its node are followed (see :meth:`_follow`)."""
        self._origin = uuid.uuid4().hex
        """Names the executions submitted here to the node, which leaves them out of what
        this side follows (their events come from their own stream)."""
        self._theirs: dict[str, ExecutionHandle] = {}
        """Executions submitted through other gateways, followed here, until done."""
        # Executions reach the node in the order they were submitted here: each holds it from
        # its gate until the node has queued it.
        self._order = asyncio.Lock()
        self._closed = False
        self._removed: set[str] = set()
        """Contexts removed through this side: refused here, as the node would (one it has
        not heard of otherwise may be another gateway's, for the node to decide)."""
        self._stopping: asyncio.Task[None] | None = None
        """Its executions' tasks being cancelled (:meth:`abandon`)."""
        self.apply(state)

    def __repr__(self) -> str:
        return f"<RemoteSession {self.id} on {self.client.node_id} {self._state.status.value}>"

    def apply(self, state: SessionState) -> None:
        """What the node said of the session, as of its last answer."""
        self._state = state
        self.id = state.id
        self.profile: Profile = state.profile
        self._contexts = dict(state.contexts)

    async def refresh(self) -> None:
        self.apply(await self.client.state(self.id))

    # -- state --------------------------------------------------------------------------------

    def state(self) -> SessionState:
        """As its node last sent it, with what happened here since (executions queued or
        ended, transfers heard, the session closed)."""
        return self._state.model_copy(update={
            "profile": self.profile, "status": self.status, "pending": len(self._queue),
            "node": self.node, "tenant": self.tenant or self._state.tenant})

    @property
    def status(self) -> SessionStatus:
        if self._closed:
            return SessionStatus.DEAD
        return self._queue.status(self._state.status)

    @property
    def paused(self) -> bool:
        return self._state.status is SessionStatus.PAUSED

    @property
    def pending(self) -> int:
        return len(self._queue)

    @property
    def closed(self) -> bool:
        return self._closed

    closing = False
    """Set while its deletion is under way: its node may already answer without it, and so
    does this gateway (:func:`node.recovery.find`)."""

    @property
    def current(self) -> ExecutionHandle | None:
        return self._queue.current

    # -- executions ---------------------------------------------------------------------------

    def submit(self, code: str, timeout_s: float | None = None,
               execution_id: str | None = None, gate: Gate | None = None, *,
               language: str | None = None, context_id: str | None = None) -> ExecutionHandle:
        if self._closed:
            raise SessionClosed(self.id)
        timeout = self.profile.timeout_for(timeout_s)
        sent_as, context = self._context_of(language, context_id)
        if self.max_queued is not None and len(self._queue) >= self.max_queued:
            raise QueueFull(self.id, self.max_queued)
        handle = ExecutionHandle(execution_id or uuid.uuid4().hex, code, timeout,
                                 language=sent_as, context_id=context)
        handle.gate = gate
        self._queue.add(handle, self._execute(handle, language, context_id),
                        name=f"remote-exec-{handle.id}")
        return handle

    def _context_of(self, language: str | None, context_id: str | None) -> tuple[str, str]:
        """The language and context an execution is recorded with, checked as far as this
        side knows: a language the image lacks is refused here, as the node would; a context
        this side has not heard of may have been made through another gateway, so the node
        decides (an unknown one ends the execution with the node's refusal)."""
        if context_id is not None:
            if context_id in self._removed:
                raise ContextNotFound(self.id, context_id)
            known = self._contexts.get(context_id)
            if known is not None and language is not None and (
                    check_language(language, self.languages) != known):
                raise InvalidRequest(
                    f"context {context_id!r} runs {known}, not {language}; send either the "
                    "context_id or the language")
            sent = (normalize_language(language) if language is not None
                    else known or DEFAULT_CONTEXT)
            return sent, context_id
        kernel = check_language(language, self.languages)
        return (kernel if language is None else normalize_language(language)), kernel

    async def _execute(self, handle: ExecutionHandle, language: str | None,
                       context_id: str | None) -> None:
        ordering = False
        try:
            await self._order.acquire()
            ordering = True
            if await self._queue.refused(handle):
                return
            submit = Submit(code=handle.code, timeout_s=handle.timeout_s, execution_id=handle.id,
                            language=language, context_id=context_id, origin=self._origin)
            async with self.client.execution(self.id, submit) as frames:
                async for frame in frames:
                    if frame.error is not None:
                        raise error_from(frame.error)
                    if frame.accepted is not None:
                        self.apply(frame.accepted)
                        self._order.release()  # queued on the node: the next may go
                        ordering = False
                        handle.dequeued()
                        self._queue.started(handle)
                    elif frame.event is not None:
                        self._queue.publish(handle, frame.event)
                        if isinstance(frame.event, DoneEvent):
                            # Read on to the stream's end (it ends after done): a response
                            # left unread closes its connection, and the next execution
                            # would pay a new TLS handshake.
                            self._ended(frame.event)
            if handle.done is None:
                raise NodeUnreachable(self.id, f"its node {self.node} ended the execution's "
                                      "stream before it was done")
        except BaseException as exc:
            if handle.done is None:
                reason = ("the session was closed" if self._closed
                          else str(exc) if isinstance(exc, KernelPoolError)
                          else f"internal error: {exc!r}")
                if not isinstance(exc, asyncio.CancelledError | KernelPoolError):
                    logger.exception("remote execution %s failed", handle.id)
                self._queue.publish(handle, DoneEvent(status=ExecutionStatus.DIED,
                                                      execution_count=None, duration_ms=0.0,
                                                      reason=reason))
            if not isinstance(exc, Exception):
                raise
        finally:
            if ordering:
                self._order.release()
            self._queue.remove(handle)

    def _ended(self, done: DoneEvent) -> None:
        # (Its own copy of the node's last state: only state() hands it out, copied.)
        if done.execution_count is not None:
            self._state.execution_count = done.execution_count
        elif done.restarted:
            self._state.execution_count = 0

    async def interrupt(self, context_id: str | None = None) -> bool:
        withdrawn = self._queue.withdraw(context_id)  # held by its gate here
        if withdrawn is not None:
            return withdrawn
        params = {} if context_id is None else {"context_id": context_id}
        answer: Interrupted = await self._call(
            "POST", f"/sessions/{self.id}/interrupt", Interrupted, session_id=self.id,
            params=params)
        return answer.interrupted

    async def restart(self) -> None:
        self.apply(await self._state_call("POST", "restart"))

    async def relay(self, msg_type: str, content: dict[str, Any], *,
                    channel: str = "shell") -> AsyncIterator[tuple[str, dict[str, Any]]]:
        if self._closed:
            raise SessionClosed(self.id)
        async with self.client.stream(
                f"/sessions/{self.id}/relay",
                Relay(msg_type=msg_type, content=content, channel=channel), self.id) as frames:
            async for frame in frames:
                if frame.error is not None:
                    raise error_from(frame.error)
                if frame.relayed is not None:
                    message = {**frame.relayed.message, "buffers": frame.relayed.buffers}
                    yield frame.relayed.channel, message

    # -- lifecycle ----------------------------------------------------------------------------

    def pause(self) -> Awaitable[PauseInfo]:
        return self._pause()

    async def _pause(self) -> PauseInfo:
        self.apply(await self._state_call("POST", "pause"))
        if self._state.pause_info is None:
            raise KernelPoolError(f"session {self.id}: its node paused it but sent no pause "
                                  "information")
        return self._state.pause_info

    async def resume(self) -> None:
        self.apply(await self._state_call("POST", "resume"))

    async def close(self) -> None:
        if self._closed:
            return
        self.closing = True
        try:
            # Gone already: the node culled it, or another gateway deleted it.
            with contextlib.suppress(SessionNotFound, SessionClosed):
                await self.client.call("DELETE", f"/sessions/{self.id}", session_id=self.id)
        finally:
            self.closing = False  # closed, or not (a node not answering): nothing changed
        self.abandon()

    def abandon(self) -> None:
        """End the session on this side only (its node is gone, or removes it itself)."""
        self._closed = True
        if self._following is not None:
            self._following.cancel()
        self._stopping = asyncio.get_running_loop().create_task(self._queue.cancel())

    # -- following the session on its node ----------------------------------------------------

    def _follow_or_not(self) -> None:
        """Follow the session's events on its node while anyone listens to its transfers (a
        session socket, a watcher): pauses and resumes, and executions submitted through
        other gateways, reach them then as they reach a local session's listeners."""
        wanted = bool(self.transfer_listeners) and not self._closed
        if wanted and (self._following is None or self._following.done()):
            self._following = asyncio.create_task(self._follow(), name=f"follow-{self.id}")
        elif not wanted and self._following is not None:
            self._following.cancel()
            self._following = None
            self.followed.clear()

    async def _follow(self) -> None:
        """Hear the node's stream of the session's events, again after a break, until no one
        listens or the session is gone."""
        while not self._closed:
            try:
                async with self.client.stream(
                        f"/sessions/{self.id}/events?origin={self._origin}", None,
                        self.id) as frames:
                    async for frame in frames:
                        self._heard(frame)
            except (SessionNotFound, SessionClosed):
                return
            except KernelPoolError as exc:
                logger.info("following session %s: %s; following again", self.id, exc)
            finally:
                self.followed.clear()
                for handle in self._theirs.values():  # their ends went unheard
                    self._queue.publish(handle, DoneEvent(
                        status=ExecutionStatus.DIED, execution_count=None, duration_ms=0.0,
                        reason="its events were lost on the way from the node; its history "
                               "has its result"))
                self._theirs.clear()
            await asyncio.sleep(FOLLOW_AGAIN_S)

    def _heard(self, frame: Frame) -> None:
        if frame.accepted is not None:
            self.apply(frame.accepted)
            self.followed.set()
        elif frame.transfer is not None:
            transfer = frame.transfer
            self._state.transfer = transfer if transfer.state == "running" else None
            for listener in list(self.transfer_listeners):
                try:
                    listener(self, transfer)
                except Exception:
                    logger.exception("session transfer listener failed")
        elif frame.started is not None:
            started = frame.started
            handle = ExecutionHandle(started.execution_id, started.code, started.timeout_s,
                                     language=started.language, context_id=started.context_id)
            handle.dequeued_ns = handle.submitted_ns
            self._theirs[handle.id] = handle
            self._queue.started(handle)
        elif frame.executed is not None:
            theirs = self._theirs.get(frame.executed.execution_id)
            if theirs is not None:  # (one begun before this side followed is not told)
                self._queue.publish(theirs, frame.executed.event)
                if isinstance(frame.executed.event, DoneEvent):
                    self._ended(frame.executed.event)
                    del self._theirs[theirs.id]

    async def _state_call(self, method: str, action: str) -> SessionState:
        state: SessionState = await self._call(
            method, f"/sessions/{self.id}/{action}", SessionState, session_id=self.id)
        return state

    # -- the sandbox --------------------------------------------------------------------------

    def sandbox_info(self) -> SandboxInfo:
        return self._state.sandbox

    # -- code contexts --------------------------------------------------------------------

    @property
    def languages(self) -> tuple[str, ...]:
        return self._state.languages

    async def list_contexts(self) -> list[ContextInfo]:
        response = await self._call("GET", f"/sessions/{self.id}/contexts",
                                          session_id=self.id)
        contexts = _CONTEXTS.validate_json(response.content)
        self._contexts = {context.id: context.language for context in contexts}
        return contexts

    async def create_context(self, language: str | None = None,
                             cwd: str | None = None) -> ContextInfo:
        if self._closed:
            raise SessionClosed(self.id)
        context: ContextInfo = await self._call(
            "POST", f"/sessions/{self.id}/contexts", ContextInfo, session_id=self.id,
            content=CreateContext(language=language, cwd=cwd).model_dump_json(),
            headers={"content-type": "application/json"})
        self._contexts[context.id] = context.language
        return context

    async def restart_context(self, context_id: str) -> None:
        self.apply(await self._state_call("POST", f"contexts/{context_id}/restart"))

    async def remove_context(self, context_id: str) -> None:
        self.apply(await self._state_call("DELETE", f"contexts/{context_id}"))
        self._removed.add(context_id)
