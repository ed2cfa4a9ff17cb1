"""A session: one kernel and its workspace, running executions one at a time, in order.

:class:`Session` is what callers above kernel_pool hold: every capability they use (execute,
interrupt, restart, relay raw Jupyter messages, workspace files, sandbox facts) is an async
method here, and the blocking I/O behind them runs in worker threads inside kernel_pool. New
lifecycle capabilities (pause, resume, fork, commands) join the kernel's section below.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import shlex
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import anyio.to_thread

from kernel_pool._caused import caused
from kernel_pool._commands import CommandEmit, CommandRun
from kernel_pool._context_code import FOLDER_CHECK, check_cwd, folder_refusal
from kernel_pool._contexts import (
    JS_LATE_OUTPUT,
    CodeContext,
    ContextInfo,
    Contexts,
    close_context,
)
from kernel_pool._egress import EgressAttempt
from kernel_pool._execution import ExecutionRun
from kernel_pool._handle import ExecutionHandle, Gate, utcnow
from kernel_pool._kernel import Kernel, KernelDied, KernelState
from kernel_pool._languages import check_language, display_language, normalize_language
from kernel_pool._queue import ExecutionQueue
from kernel_pool._snapshot import (
    STOPPED_COMMAND,
    SnapshotStore,
    context_entry,
    copy_workspace,
    load_variables,
    save_variables,
)
from kernel_pool._usage import SandboxUsage, read_usage
from kernel_pool._workspace import (
    OLD_SANDBOX_PATH,
    SANDBOX_PATH,
    Entry,
    FileInfo,
    Workspace,
    split_relative,
)
from kernel_pool.backends.base import SandboxInfo
from kernel_pool.config import PoolSettings, Profile
from kernel_pool.events import (
    CommandResult,
    DoneEvent,
    ErrorEvent,
    Event,
    Execution,
    ExecutionStatus,
)
from kernel_pool.exceptions import (
    BackendError,
    ContextNotFound,
    InvalidRequest,
    KernelPoolError,
    KernelUnavailable,
    QueueFull,
    SessionClosed,
    SnapshotError,
    TooManyCommands,
)
from kernel_pool.port import Listener, TransferListener
from kernel_pool.state import KeptContext, PauseInfo, SessionState, SessionStatus, Transfer

T = TypeVar("T")

logger = logging.getLogger(__name__)


class Lifecycle(Protocol):
    """What a session needs from its pool to pause and resume: slots for running kernels."""

    snapshots: SnapshotStore

    @property
    def checkpoint_refusal(self) -> str | None:
        """Why the backend cannot checkpoint a sandbox (a memory pause); None when it can."""

    async def reserve_slot(self, session: Session) -> None:
        """Make room for the session's kernel to run (pausing another), or CapacityError."""

    def release_slot(self, session: Session) -> None:
        """The session's kernel stopped running (paused): its slot is free."""

    async def take_warm(self, session: Session) -> Kernel | None:
        """A warm kernel of the session's profile to resume onto (idle, or the next one a
        refill under way brings up), or None."""

    def give_back(self, kernel: Kernel) -> None:
        """Remove a kernel ``take_warm`` gave or one the session no longer uses."""

    def resumed(self, session: Session) -> None:
        """The session runs again (on a new sandbox, perhaps): the pool tells its listeners."""

    async def paused_here(self, session: Session) -> None:
        """The session is paused (its snapshot written, its kernel stopped or checkpointed):
        kept elsewhere too where the pool is told to (a node's bundle store), before the
        pause answers and before anything may resume it (the session's lock is held)."""

    async def resumed_here(self, session: Session) -> None:
        """The session runs again: noted where the pool is told to (a node records it in the
        shared database) before any code runs (the session's lock is held)."""


WARM_RESUME_MAX_BYTES = 64 * 1024 * 1024
"""Workspaces up to this size are copied onto a warm kernel on resume; larger ones get a new
container on their own workspace (no copy)."""
# A pause stops the shell commands running beside the kernel: how long it waits for them to
# end, and how much of each one's text names it in ``not_kept``.
COMMANDS_END_WAIT_S = 5.0
COMMAND_SHOWN = 80


def _why(exc: BaseException) -> str:
    """What a failed resume says: the error's words, or that the caller cancelled it."""
    if isinstance(exc, asyncio.CancelledError):
        return "it was cancelled"
    return str(exc) or type(exc).__name__


TRANSFER_REPORT_S = 0.05
"""How often a transfer's progress is told: a bar moves smoothly, a socket is not flooded."""

class Session:
    """One kernel with its workspace. Executions queue (bounded) and run one at a time."""

    def __init__(self, kernel: Kernel, profile: Profile, settings: PoolSettings, *,
                 session_id: str | None = None, env: dict[str, str] | None = None,
                 metadata: dict[str, Any] | None = None, tenant: str = "") -> None:
        self.id = session_id or str(uuid.uuid4())
        self.kernel = kernel
        kernel.on_death = self._kernel_died
        if kernel.egress is not None:
            kernel.egress.session_id = self.id  # egress attempts are logged with the session
        self.profile = profile
        self.env = dict(env or {})
        self.metadata = dict(metadata or {})
        self.tenant = tenant
        """Whose it is, as the gateway said when it was made (kept for it, never read here)."""
        self.node = settings.owner
        """The node it runs on: this pool's, named by its owner label."""
        self.created_at = utcnow()
        self.last_active_at = self.created_at
        self.execution_count = 0
        self._settings = settings
        self._created_mono = time.monotonic()
        self._active_mono = self._created_mono
        self._lock = asyncio.Lock()
        self._queue = ExecutionQueue(self)
        self._closed = False
        self._restarting = False
        self._packing: asyncio.Task[None] | None = None
        """A memory pause's packing, in the background after the pause answered."""
        self._dump: Path | None = None
        """That pause's dump while it is not packed (restorable from as it is)."""
        self.listeners: list[Listener] = self._queue.listeners
        self.commands: dict[str, CommandRun] = {}
        """Shell commands running now, by id (:meth:`run_command`)."""
        self.lifecycle: Lifecycle | None = None
        """Set by the pool: without it the session cannot pause."""
        self.pause_info: PauseInfo | None = None
        """What the snapshot kept, while the session is paused."""
        self.reason: str | None = None
        """Why the last pause, resume or fork failed, or kept less than asked (a memory pause
        that kept the variables only, a resume from the variables snapshot); the session is
        running or restorable."""
        self.pause_failed = False
        """The last pause failed and the session runs on (``reason`` says why): the pool
        does not pause it by itself again, until a pause asked for succeeds."""
        self.transfer: Transfer | None = None
        """The pause or resume moving the session's variables now, with its progress."""
        self.transfer_listeners: list[TransferListener] = []
        self._resuming_for: str | None = None
        """The execution whose start is resuming the session (its transfer names it)."""
        self._lost: str | None = None
        """Why the kernel was restarted since the last execution (it died between two): the
        next execution says so (``restarted``), so no variable vanishes silently."""
        self._contexts = Contexts(self.id)
        """Its code contexts: the kernel above (``python``) and those of other languages."""

    def __repr__(self) -> str:
        return f"<Session {self.id} {self.status.value} queued={len(self._queue)}>"

    @property
    def paused(self) -> bool:
        return self.kernel.state is KernelState.PAUSED

    @property
    def workspace(self) -> Workspace:
        return self.kernel.sandbox.workspace

    @property
    def status(self) -> SessionStatus:
        if self.paused and not self._closed:
            return SessionStatus.STARTING if self._queue else SessionStatus.PAUSED
        if self._closed or self.kernel.state in (KernelState.DEAD, KernelState.CLOSED):
            return SessionStatus.DEAD
        if self._restarting or self.kernel.state in (KernelState.STARTING,
                                                     KernelState.RESTARTING):
            return SessionStatus.STARTING
        return self._queue.status(SessionStatus.IDLE)

    @property
    def pending(self) -> int:
        """Executions queued or running."""
        return len(self._queue)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def current(self) -> ExecutionHandle | None:
        return self._queue.current

    def state(self) -> SessionState:
        """Its facts as of now (built unchecked: they are this session's own, already valid,
        and an execution's answer builds one)."""
        return SessionState.model_construct(
            id=self.id, profile=self.profile, env=self.env, metadata=self.metadata,
            created_at=self.created_at, last_active_at=self.last_active_at,
            execution_count=self.execution_count, status=self.status, pending=self.pending,
            pause_info=self.pause_info, reason=self.reason, transfer=self.transfer,
            sandbox=self.sandbox_info(), languages=self.languages, contexts=self.contexts,
            node=self.node, tenant=self.tenant)

    async def refresh(self) -> None:
        """Nothing to ask: its state is read where it is kept, in this process."""

    def idle_for(self) -> float:
        # A shell command running is activity: no idle pause or cull may end it unseen.
        return 0.0 if self._queue or self.commands else time.monotonic() - self._active_mono

    def age(self) -> float:
        return time.monotonic() - self._created_mono

    # -- executions ----------------------------------------------------------------------------

    def submit(self, code: str, timeout_s: float | None = None,
               execution_id: str | None = None, gate: Gate | None = None, *,
               language: str | None = None, context_id: str | None = None) -> ExecutionHandle:
        """Queue ``code``; returns at once with a handle to stream or await.

        ``gate``, if given, decides under the session's lock whether the code runs (see
        :data:`Gate`). ``context_id`` names the code context to run in; else ``language``
        (None: python) runs in that language's default context, made now if need be
        (:class:`UnknownLanguage` for one the image does not offer). Executions of every
        context share the session's one queue.
        """
        if self._closed:
            raise SessionClosed(self.id)
        timeout = self.profile.timeout_for(timeout_s)
        context = self._contexts.resolve(language, context_id, self.languages)
        if len(self._queue) >= self._settings.max_queued_executions:
            raise QueueFull(self.id, self._settings.max_queued_executions)
        # Recorded with its aliases resolved (``ts`` is ``typescript``, which runs in the
        # JavaScript context).
        sent_as = context.language if language is None else normalize_language(language)
        handle = ExecutionHandle(execution_id or uuid.uuid4().hex, code, timeout,
                                 language=sent_as, context_id=context.id)
        handle.gate = gate
        self._queue.add(handle, self._execute(handle), f"exec-{handle.id}")
        self._touch()
        return handle

    async def execute(self, code: str, timeout_s: float | None = None) -> Execution:
        """Run ``code`` and return the aggregate result."""
        return await self.submit(code, timeout_s).result()

    def prepare_command(self, command: str, *, timeout_s: float | None = None,
                        env: dict[str, str] | None = None, cwd: str | None = None,
                        command_id: str | None = None) -> CommandRun:
        """Check a shell command's request; the run to pass to :meth:`run_prepared`.

        Commands run beside the kernel, not in the execution queue: one may run while code
        does (at most ``max_commands`` per session at once).
        """
        if self._closed or self.status is SessionStatus.DEAD:
            raise SessionClosed(self.id)
        if not command.strip():
            raise InvalidRequest("cmd is empty; send the shell command to run, e.g. 'ls -la'")
        if "\x00" in command:
            raise InvalidRequest("cmd contains a NUL character, which a shell cannot take")
        timeout = self.profile.timeout_for(timeout_s)
        for root in (SANDBOX_PATH, OLD_SANDBOX_PATH):  # the path as the sandbox sees it
            if cwd is not None and (cwd == root or cwd.startswith(f"{root}/")):
                cwd = cwd.removeprefix(root).lstrip("/")
        folder = "/".join(split_relative(cwd)) if cwd not in (None, "", ".") else ""
        if len(self.commands) >= self._settings.max_commands:
            raise TooManyCommands(self.id, self._settings.max_commands)
        command_id = command_id or f"cmd-{uuid.uuid4().hex}"
        if command_id in self.commands:
            raise InvalidRequest(f"command id {command_id!r} is already running")
        return CommandRun(self.kernel.sandbox, command, command_id=command_id,
                          timeout_s=timeout, caps=self.profile.caps,
                          env={**self.env, **(env or {})}, cwd=folder)

    async def kill_command(self, command_id: str) -> bool:
        """Stop a running command and its process group; False when none runs under that id."""
        run = self.commands.get(command_id)
        return run is not None and run.kill()

    async def run_command(self, command: str, *, timeout_s: float | None = None,
                          env: dict[str, str] | None = None, cwd: str | None = None,
                          command_id: str | None = None,
                          emit: CommandEmit | None = None,
                          on_start: Callable[[], None] | None = None) -> CommandResult:
        """Run a shell command to its end (:meth:`prepare_command` says what is refused);
        ``emit`` is told of its output as it comes; its aggregate result."""
        run = self.prepare_command(command, timeout_s=timeout_s, env=env, cwd=cwd,
                                   command_id=command_id)
        return await self.run_prepared(run, emit, on_start)

    async def run_prepared(self, run: CommandRun, emit: CommandEmit | None = None,
                           on_start: Callable[[], None] | None = None) -> CommandResult:
        """Run a command from :meth:`prepare_command` to its end; its aggregate result.
        ``on_start`` is called once :meth:`kill_command` can reach it by its id."""
        if run.id in self.commands:
            raise InvalidRequest(f"command id {run.id!r} is already running")
        if self.paused:  # a command runs in the sandbox's container: bring it back first
            await self.resume()
            run.sandbox = self.kernel.sandbox  # a resume may have moved it to a new sandbox
        self.commands[run.id] = run
        self._touch()
        try:
            if on_start is not None:
                on_start()
            done = await run.run(emit or (lambda _event: None))
        finally:
            self.commands.pop(run.id, None)
            self._touch()
        return run.result(done)

    async def _execute(self, handle: ExecutionHandle) -> None:
        try:
            async with self._lock:
                handle.dequeued()
                if self._closed:
                    raise SessionClosed(self.id)
                if handle.withdrawn is not None:
                    self._publish(handle, DoneEvent(
                        status=ExecutionStatus.INTERRUPTED, execution_count=None,
                        duration_ms=0.0, reason=handle.withdrawn))
                    return
                if await self._queue.refused(handle):
                    return
                if self.paused and await self._resume_failed(handle):
                    return
                context = await self._context_ready(handle)
                if context is None:
                    return
                kernel = self.kernel if context.kernel is None else context.kernel
                lost = self._lost if context.default else context.lost
                run = ExecutionRun(kernel, handle.code, timeout_s=handle.timeout_s,
                                   caps=self.profile.caps, execution_id=handle.id,
                                   interrupt_grace_s=self._settings.interrupt_grace_s,
                                   restarted_before=lost,
                                   late_output=JS_LATE_OUTPUT
                                   if context.language == "javascript" else None)
                if context.default:
                    self._lost = None
                context.lost = None
                handle.run = run
                handle.started_at = utcnow()
                self._queue.started(handle)
                context.busy = True
                try:
                    done = await run.run(lambda event: self._publish(handle, event))
                finally:
                    context.busy = False
                count = (done.execution_count if done.execution_count is not None
                         else 0 if done.restarted else None)
                if count is not None:
                    if context.default:
                        self.execution_count = count
                    else:
                        context.execution_count = count
                self._publish(handle, done)
        except BaseException as exc:
            if handle.done is None:
                reason = ("the session was closed" if self._closed
                          else f"internal error: {exc!r}")
                if not isinstance(exc, asyncio.CancelledError | SessionClosed):
                    logger.exception("execution %s failed", handle.id)
                self._publish(handle, DoneEvent(status=ExecutionStatus.DIED, execution_count=None,
                                                duration_ms=0.0, reason=reason))
            if not isinstance(exc, Exception):
                raise
        finally:
            self._queue.remove(handle)
            self._touch()
            death = self.kernel.death
            if not self._closed and self.kernel.state == KernelState.DEAD and death is not None:
                self._kernel_died(death)  # died in the clean-up after the reply

    async def _context_ready(self, handle: ExecutionHandle) -> CodeContext | None:
        """The execution's context with its kernel ready (started now at its first use, or
        again after a death); None when it cannot be had (the execution then ends with an
        error that says why)."""
        try:
            context = self._contexts.get(handle.context_id)
            if not context.default:
                await self._contexts.start(context, self.kernel.sandbox, self.env, self.kernel,
                                           self._settings.kernel_start_timeout_s)
            return context
        except KernelPoolError as exc:
            ename = type(exc).__name__
            reason = (str(exc) if isinstance(exc, ContextNotFound) else
                      f"the {display_language(handle.language)} kernel did not start: {exc}")
        self._publish(handle, ErrorEvent(ename=ename, evalue=reason,
                                         traceback=[f"{ename}: {reason}"]))
        self._publish(handle, DoneEvent(status=ExecutionStatus.ERROR, execution_count=None,
                                        duration_ms=0.0, reason=reason))
        return None

    def _kernel_died(self, died: KernelDied) -> None:
        """The kernel died: a running execution recovers it; between executions, or after an
        execution's reply (its clean-up can stop the sandbox: gVisor's swarm), we do."""
        current = self.current
        if self._closed or (current is not None and current.done is None):
            return
        self._queue.spawn(self._recover(died), f"recover-{self.id}")

    async def _recover(self, died: KernelDied) -> None:
        async with self._lock:
            if self._closed or self.kernel.state != KernelState.DEAD:
                return
            logger.info("session %s: kernel died between executions (%s); restarting it",
                        self.id, died.reason)
            self._restarting = True
            self._lost = (f"{died.reason}, between executions; a fresh kernel was started "
                          "(variables lost, files kept)")
            try:
                await self.kernel.restart()
                self.execution_count = 0
            except Exception:
                logger.exception("session %s: restarting its dead kernel failed", self.id)
            finally:
                self._restarting = False

    async def _resume_failed(self, handle: ExecutionHandle) -> bool:
        """Resume a paused session for an execution; if it cannot, end the execution (an
        error with the reason) and leave the session paused."""
        self._resuming_for = handle.id
        try:
            await self._resume_locked()
            return False
        except Exception as exc:
            reason = f"the paused session could not be resumed: {exc}"
            self._publish(handle, ErrorEvent(ename="ResumeError", evalue=reason,
                                             traceback=[f"ResumeError: {reason}"]))
            self._publish(handle, DoneEvent(status=ExecutionStatus.ERROR, execution_count=None,
                                            duration_ms=0.0, reason=reason))
            return True
        finally:
            self._resuming_for = None

    # -- pause, resume ---------------------------------------------------------------------

    @caused("pause")
    async def pause(self) -> PauseInfo:
        """Keep the session's variables in a snapshot and stop its kernel and container.

        Waits for queued executions first. On any failure the session goes on running and
        :class:`SnapshotError` (or the backend's error) says why; nothing is deleted.
        """
        if self._closed:
            raise SessionClosed(self.id)
        async with self._lock:
            if self._closed:
                raise SessionClosed(self.id)
            return await self._pause_locked()

    async def _pause_locked(self) -> PauseInfo:
        if self.paused and self.pause_info is not None:
            return self.pause_info
        if self.lifecycle is None:
            raise SnapshotError("this session's pool cannot pause sessions")
        if self.kernel.state is not KernelState.READY:
            raise SnapshotError(f"the kernel is {self.kernel.state.value}, not ready")
        store = self.lifecycle.snapshots
        try:
            info: PauseInfo = await self._transferring("pause", save_variables(
                self.kernel, store, self.id, progress=self._progress))
        except SnapshotError as exc:
            self.reason = f"pause failed, the session runs on: {exc}"
            self.pause_failed = True
            raise
        self.pause_info = info
        self.reason = None
        self.pause_failed = False
        keep, refused = self._contexts_to_keep()
        wants_memory = bool(keep) or self._settings.pause_with == "memory" or (
            self._settings.pause_with == "auto" and bool(info.not_kept))
        if wants_memory and self._memory_refusal() is not None:
            keep = []
        ended = {**await self._end_commands(), **await self._end_contexts(keep, refused)}
        held = {context_entry(context.id): (
            f"its {display_language(context.language)} kernel: only the memory image holds "
            "it; it starts afresh at its next execution") for context in keep}
        if ended or held:
            info = info.model_copy(update={
                "not_kept": {**info.not_kept, **ended, **held},
                "contexts": [KeptContext(id=c.id, language=c.language, name=c.name,
                                         cwd=c.cwd) for c in keep]})
            await anyio.to_thread.run_sync(store.save_info, self.id, info)
            self.pause_info = info
        if wants_memory:
            try:
                memory = await self._checkpoint(store, info, keep)
            except BaseException:
                # Cancelled (a shutdown cancels the pauses it started): the snapshot written
                # above says the session is paused, and a later gateway takes it back so.
                # It must not run on beside it, holding its slot: end as a variables pause.
                await asyncio.shield(self._stop_paused())
                raise
            if memory is not None:
                for context in keep:  # the image holds them; a restore connects them again
                    await close_context(context, kill=False, held=True)
                self.pause_info = memory
                self.lifecycle.release_slot(self)
                await self.lifecycle.paused_here(self)
                return memory
        if keep:  # the variables alone keep none of them (``not_kept`` says so already)
            await self._end_contexts()
            info = info.model_copy(update={"contexts": []})
            await anyio.to_thread.run_sync(store.save_info, self.id, info)
            self.pause_info = info
        await self._stop_paused()
        await self.lifecycle.paused_here(self)
        return info

    def _contexts_to_keep(self) -> tuple[list[CodeContext], dict[str, str]]:
        """The code contexts whose kernels a memory pause would keep (those that run, and
        the sandbox can hold), and why each other running one cannot be kept, by id. A
        session that runs one to keep wants a memory pause whatever ``pause_with`` says
        (a variables pause would lose it), unless pauses keep variables only."""
        keep: list[CodeContext] = []
        refused: dict[str, str] = {}
        if self._settings.pause_with == "variables":
            return keep, refused
        for context in self._contexts:
            if (context.default or context.kernel is None
                    or context.kernel.state is not KernelState.READY):
                continue
            why = self.kernel.sandbox.context_refusal(context.language)
            if why is None:
                keep.append(context)
            else:
                refused[context.id] = why
        return keep, refused

    def _memory_refusal(self) -> str | None:
        """Why this session cannot be paused with its memory, if it cannot."""
        assert self.lifecycle is not None
        return self.lifecycle.checkpoint_refusal or self.kernel.sandbox.checkpoint_refusal

    async def _end_commands(self) -> dict[str, str]:
        """Stop the shell commands running beside the kernel, which no pause keeps (they are
        not the kernel's processes; a memory dump must not meet them either), and wait a
        little for them to end; what was stopped, as ``not_kept`` entries."""
        ended = {f"{STOPPED_COMMAND}{run.command[:COMMAND_SHOWN]!r}":
                 "a running shell command: the pause stopped it"
                 for run in list(self.commands.values())
                 if run.kill("the session was paused; a pause keeps no running command")}
        for _ in range(int(COMMANDS_END_WAIT_S / 0.05)):
            if not self.commands:
                break
            await asyncio.sleep(0.05)
        return ended

    async def _end_contexts(self, spare: list[CodeContext] | None = None,
                            refused: dict[str, str] | None = None) -> dict[str, str]:
        """End the kernels of the code contexts that the pause does not keep (but those in
        ``spare``, for a memory pause); what was ended, as ``not_kept`` entries, with the
        reason ``refused`` gives by id, if any. Each starts afresh at its next execution,
        which says so."""
        ended = {}
        for context in self._contexts:
            if context.default or context.kernel is None or context in (spare or ()):
                continue
            await close_context(context)
            language = display_language(context.language)
            why = (refused or {}).get(context.id, "the pause could not keep it")
            context.lost = (f"the session was paused, and the pause kept no {language} "
                            "kernel: a fresh one was started (variables lost, files kept)")
            ended[context_entry(context.id)] = (
                f"its {language} kernel: {why}; it starts afresh at its next execution")
        return ended

    async def _stop_paused(self) -> None:
        """Stop the kernel of a session whose snapshot is written, and free its slot (a
        container checkpointed for an image that was not kept is removed too)."""
        assert self.lifecycle is not None
        try:
            await self.kernel.stop()
        except Exception as exc:  # the snapshot is written: the session is restorable
            self.reason = f"paused, but its container could not be removed: {exc}"
            logger.warning("session %s: %s", self.id, self.reason)
        self.lifecycle.release_slot(self)

    async def _checkpoint(self, store: SnapshotStore, info: PauseInfo,
                          keep: list[CodeContext]) -> PauseInfo | None:
        """A memory pause, after the variables snapshot was written: the whole sandbox
        dumped (with the kernels of the contexts in ``keep``), counted against the budget,
        and packed into the store in the background (:meth:`_pack`): the pause answers once
        the dump is on disk. None when it could not be made (``reason`` says why; the kernel
        runs on or is stopped by the variables pause that follows)."""
        # Decided before the kernel's connections are dropped for a dump that cannot be made.
        refusal = self._memory_refusal()
        if refusal is not None:
            self.reason = f"paused with variables: memory pauses are not available ({refusal})"
            return None
        try:
            for context in keep:
                assert context.kernel is not None
                await context.kernel.disconnect_for_checkpoint()
            dump = await self.kernel.suspend()
        except Exception as exc:
            self.reason = f"paused with variables: the memory checkpoint failed ({exc})"
            logger.warning("session %s: %s", self.id, self.reason)
            return None
        return await self._keep_dump(store, dump, info)

    async def _keep_dump(self, store: SnapshotStore, dump: Path,
                         info: PauseInfo) -> PauseInfo | None:
        """Count a memory dump against the budget and pack it in the background
        (:meth:`_pack`); the memory pause's info. None when it does not fit (it is removed,
        the variables snapshot of ``info`` stays; ``reason`` says why)."""
        try:
            size = await self.kernel.sandbox.checkpoint_bytes(dump)
            memory = await anyio.to_thread.run_sync(store.hold_memory, self.id, size, info)
        except BaseException as exc:  # stopped: a variables pause (cancelled too)
            self._dump = dump
            await asyncio.shield(self._forget_memory(store, info))
            if not isinstance(exc, (SnapshotError, OSError, BackendError)):
                raise
            self.reason = f"paused with variables: the memory dump was not kept ({exc})"
            logger.warning("session %s: %s", self.id, self.reason)
            return None
        self._dump = dump
        self._packing = self._queue.spawn(self._pack(dump, info), f"pack-{self.id}")
        return memory

    async def _pack(self, dump: Path, info: PauseInfo) -> None:
        """Pack the memory dump into the store. If that fails (a full disk, the budget), the
        dump is discarded and the session is paused with its variables, ``reason`` saying so.
        Cancelled (a resume, a deletion, a restart), it leaves the dump to the canceller."""
        assert self.lifecycle is not None
        store, sandbox = self.lifecycle.snapshots, self.kernel.sandbox
        try:
            stem = await anyio.to_thread.run_sync(store.memory_stem, self.id)
            image = await sandbox.pack_checkpoint(dump, stem)
            self._dump = None
            self.pause_info = await anyio.to_thread.run_sync(store.keep_memory, self.id,
                                                             image, info)
        except (SnapshotError, OSError, BackendError) as exc:
            self.reason = f"paused with variables: the memory image was not kept ({exc})"
            logger.warning("session %s: %s", self.id, self.reason)
            self.pause_info = info
            await asyncio.shield(self._forget_memory(store, info))
            with contextlib.suppress(Exception):  # the container goes with the session else
                await asyncio.shield(self.kernel.stop())
        finally:
            self._packing = None

    async def _forget_memory(self, store: SnapshotStore, info: PauseInfo | None) -> None:
        """Remove a memory pause's dump and image, its variables snapshot kept (and noted as
        the session's pause again, with ``info``)."""
        if self._dump is not None:
            await self.kernel.sandbox.discard_checkpoint(self._dump)
            self._dump = None
        await anyio.to_thread.run_sync(store.delete_memory, self.id)
        if info is not None:
            await self._note_pause(store, info)

    async def _note_pause(self, store: SnapshotStore, info: PauseInfo) -> None:
        """Write the pause's info again (it kept less than its record says). If that fails
        (a full disk), the record still says memory: a later gateway finds no image nor dump
        and says the memory was lost."""
        try:
            await anyio.to_thread.run_sync(store.save_info, self.id, info)
        except SnapshotError as exc:
            logger.warning("session %s: its pause's record was not updated: %s", self.id, exc)

    def recall_contexts(self) -> list[CodeContext]:
        """Know the code contexts the pause's info names (a session taken back, or made from
        another node's bundle): listed while paused as they were; at the resume their kernels
        come back with the memory image, or start afresh and say so. Those contexts."""
        return [self._contexts.adopt(held.id, held.language, held.name, held.cwd)
                for held in (self.pause_info.contexts if self.pause_info else [])]

    async def take_back(self) -> None:
        """Settle what an earlier gateway left of this paused session's memory pause (call
        once, when a new gateway takes the session back): it may have been stopped, or
        killed, while the dump was being packed. A whole dump is counted and packed again
        (restorable from meanwhile); without it or an archive the session is paused with its
        variables, and ``reason`` says the memory was lost. A dump nothing uses is removed
        (partial archives went at the pool's start, :meth:`SnapshotStore.remove_partials`)."""
        assert self.lifecycle is not None
        info = self.pause_info
        if info is None:
            return
        self.recall_contexts()
        store = self.lifecycle.snapshots
        # Where this gateway cannot checkpoint, no dump of the sandbox can be restored either
        # (nor read, without root): it goes with the container.
        dump = (await self.kernel.sandbox.left_checkpoint()
                if self.lifecycle.checkpoint_refusal is None else None)
        image = await anyio.to_thread.run_sync(store.memory_image, self.id)
        if info.paused_with != "memory" or image is not None:
            if dump is not None:  # a dump the pause did not keep, or packed already
                await self.kernel.sandbox.discard_checkpoint(dump)
            return
        variables = await anyio.to_thread.run_sync(store.variables_only, self.id, info)
        if dump is not None:
            kept = await self._keep_dump(store, dump, variables)
            self.pause_info = kept or variables
            return
        self.pause_info = variables
        self.reason = ("paused with variables: its memory image was lost (a gateway stopped "
                       "before it was packed, and no whole dump of it is left)")
        logger.warning("session %s: %s", self.id, self.reason)
        await self._note_pause(store, variables)

    async def packed(self) -> None:
        """Wait for a memory pause's packing, if one runs (the gateway's stop lets it end)."""
        if self._packing is not None:
            await asyncio.shield(self._packing)

    async def _stop_packing(self) -> Path | None:
        """Cancel a memory pause's packing, if one runs; its dump, if not packed yet."""
        packing = self._packing
        if packing is not None:
            packing.cancel()
            await asyncio.wait([packing])
        return self._dump

    async def _transferring(self, operation: str, moving: Any) -> Any:
        """Await ``moving`` (a snapshot's stream) with :attr:`transfer` showing its progress:
        a pause's total is the sandbox's memory in use, a resume's the stored snapshot."""
        total = 0
        if operation == "pause":
            total = (await self.kernel.sandbox.usage()).memory_bytes or 0
        elif self.lifecycle is not None:
            stored = await anyio.to_thread.run_sync(
                self.lifecycle.snapshots.variables_only, self.id, PauseInfo())
            total = stored.image_bytes
        transfer = self.transfer = Transfer(operation=operation, total_bytes=total,
                                            execution_id=self._resuming_for)
        self._tell(transfer.model_copy())
        reporter = self._queue.spawn(self._report(transfer), f"transfer-{self.id}")
        try:
            result = await moving
        except BaseException:
            ended = transfer.model_copy(update={"state": "failed"})
            raise
        else:
            # Every byte moved; a pause's size is known only now: what the kernel wrote.
            size = max(transfer.done_bytes, result.raw_bytes if operation == "pause"
                       else transfer.total_bytes)
            ended = transfer.model_copy(update={"state": "done", "done_bytes": size,
                                                "total_bytes": size})
        finally:
            reporter.cancel()
            self.transfer = None
            self._tell(ended)
        return result

    async def _report(self, transfer: Transfer) -> None:
        """Tell the listeners ``transfer``'s progress while it advances (until cancelled)."""
        told = transfer.done_bytes
        while True:
            await asyncio.sleep(TRANSFER_REPORT_S)
            if transfer.done_bytes != told:
                told = transfer.done_bytes
                self._tell(transfer.model_copy())

    def _tell(self, transfer: Transfer) -> None:
        for listener in list(self.transfer_listeners):
            try:
                listener(self, transfer)
            except Exception:
                logger.exception("session transfer listener failed")

    def _progress(self, done: int) -> None:
        """A stream's progress (called from its worker thread: one attribute's store)."""
        transfer = self.transfer
        if transfer is not None:
            transfer.done_bytes = done

    async def resume(self) -> None:
        """Start a kernel on the workspace again and put the snapshot's variables back.

        On failure the session stays paused with its snapshot (restorable) and the error
        says why.
        """
        if self._closed:
            raise SessionClosed(self.id)
        async with self._lock:
            if self._closed:
                raise SessionClosed(self.id)
            await self._resume_locked()

    @caused("resume")
    async def _resume_locked(self) -> None:
        if not self.paused or self.lifecycle is None:
            return
        store = self.lifecycle.snapshots
        memory = self.pause_info is not None and self.pause_info.paused_with == "memory"
        try:
            # A memory image that cannot be restored leaves the variables snapshot, untouched.
            fallback = await self._restore() if memory else None
            if not memory or fallback is not None:
                await self._resume_variables(store)
                self._contexts_not_restored()
        except BaseException as exc:  # it stays paused, its snapshot (and image) kept
            self.reason = f"resume failed, the session stays paused: {_why(exc)}"
            raise
        self.pause_info = None
        self.reason = fallback
        await anyio.to_thread.run_sync(store.delete, self.id)
        self.lifecycle.resumed(self)
        await self.lifecycle.resumed_here(self)

    async def _resume_variables(self, store: SnapshotStore) -> None:
        """A kernel with the variables snapshot loaded: a warm one, else the session's own."""
        assert self.lifecycle is not None
        used = await anyio.to_thread.run_sync(self.workspace.used_bytes)
        warm = await self.lifecycle.take_warm(self) if used <= WARM_RESUME_MAX_BYTES else None
        reseed = self.pause_info is not None and self.pause_info.reseed
        if warm is not None:
            await self._resume_onto(warm, store, reseed)
        else:
            await self._resume_in_place(store, reseed)

    @caused("restore")
    async def _restore(self) -> str | None:
        """Resume from the memory image: the sandbox restored, its kernel as it was. None
        when it ran; else why not (the kernel is paused again, for a resume from the
        variables snapshot, which the image's failure never touches)."""
        assert self.lifecycle is not None
        store = self.lifecycle.snapshots
        # A resume during the packing starts from the dump as it is (the packing stopped,
        # its partial file gone): quicker than waiting for the archive, then unpacking it.
        image = await self._stop_packing()
        if image is None:
            image = await anyio.to_thread.run_sync(store.memory_image, self.id)
        else:
            self._dump = None  # the restore removes it, whatever comes of it
            await anyio.to_thread.run_sync(store.drop_held, self.id)
        if image is None:
            why = "its memory image is missing"
        else:
            await self.lifecycle.reserve_slot(self)
            try:
                await self.kernel.start(image=image)
            except BaseException as exc:
                # Cancelled too: a half-restored sandbox must not run on unowned, holding a
                # slot, with the session neither paused nor running (the next resume then
                # finds the image unusable, and says so).
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.kernel.stop())
                self.kernel.state = KernelState.PAUSED
                self.lifecycle.release_slot(self)
                if not isinstance(exc, Exception):
                    raise
                why = f"restoring its memory failed ({exc})"
            else:
                await self._reconnect_contexts()
                return None  # the caller settles the books, as for any resume
        lost = sorted(self.pause_info.variables_not_kept) if self.pause_info else []
        logger.warning("session %s: %s; resuming from its variables", self.id, why)
        return (f"resumed from its variables snapshot: {why}"
                + (f"; not kept: {', '.join(lost)}" if lost else ""))

    def _contexts_not_restored(self) -> None:
        """Resumed from the variables: the code contexts a memory image held (or was to
        hold) are not back; each starts afresh at its next execution, which says so."""
        for context in self.recall_contexts():
            context.lost = ("the session resumed from its variables snapshot, which holds no "
                            f"{display_language(context.language)} kernel: a fresh one was "
                            "started (variables lost, files kept)")

    async def _reconnect_contexts(self) -> None:
        """After a restore from the memory image: connect the code contexts it held to
        their kernels, as they were. One that does not answer starts afresh at its next
        execution, which says so."""
        for context in self.recall_contexts():
            try:
                await self._contexts.start(context, self.kernel.sandbox, self.env, self.kernel,
                                           self._settings.kernel_start_timeout_s, restored=True)
            except Exception as exc:
                await close_context(context)
                context.lost = (f"its {display_language(context.language)} kernel did not "
                                f"come back with the session's memory ({exc}): a fresh one "
                                "was started (variables lost, files kept)")
                logger.warning("session %s: context %s: %s", self.id, context.id, context.lost)

    async def _resume_in_place(self, store: SnapshotStore, reseed: bool) -> None:
        """A new container and kernel on the session's own workspace (no copy)."""
        assert self.lifecycle is not None
        await self.lifecycle.reserve_slot(self)
        try:
            await self.kernel.start()
            await self._transferring("resume", load_variables(
                self.kernel, store, self.id, reseed, progress=self._progress))
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.kernel.stop())
            self.kernel.state = KernelState.PAUSED
            self.lifecycle.release_slot(self)
            raise

    async def _resume_onto(self, warm: Kernel, store: SnapshotStore, reseed: bool) -> None:
        """Onto a warm kernel: the workspace's files are copied into its workspace (small
        workspaces only), which beats starting a container and a kernel."""
        assert self.lifecycle is not None
        try:
            await anyio.to_thread.run_sync(copy_workspace, self.workspace,
                                           warm.sandbox.workspace)
            if self.env:
                warm.env = dict(self.env)
                await warm.set_env(warm.env)
            await self._transferring("resume", load_variables(
                warm, store, self.id, reseed, progress=self._progress))
        except BaseException:
            self.lifecycle.give_back(warm)
            raise
        old, self.kernel = self.kernel, warm
        warm.on_death = self._kernel_died
        if warm.egress is not None:
            warm.egress.session_id = self.id
        self.lifecycle.give_back(old)  # its container is gone; this removes its workspace

    async def snapshot(self, key: str) -> PauseInfo:
        """Store the session's variables as snapshot ``key`` (for a fork; the caller deletes
        it); what they kept. The session goes on unchanged."""
        if self._closed:
            raise SessionClosed(self.id)
        async with self._lock:
            if self.lifecycle is None:
                raise SnapshotError("this session's pool cannot snapshot sessions")
            store = self.lifecycle.snapshots
            if self.paused:
                # A copy starts from the variables snapshot, never from the memory image.
                info = (self.pause_info or PauseInfo()).without_memory()
                copied: PauseInfo = await anyio.to_thread.run_sync(store.copy, self.id, key,
                                                                   info)
                return copied
            if self.kernel.state is not KernelState.READY:
                raise SnapshotError(f"the kernel is {self.kernel.state.value}, not ready")
            return await save_variables(self.kernel, store, key)

    def _publish(self, handle: ExecutionHandle, event: Event) -> None:
        if isinstance(event, DoneEvent):
            event.language = handle.language
        self._queue.publish(handle, event)

    def _touch(self) -> None:
        self._active_mono = time.monotonic()
        self.last_active_at = utcnow()

    # -- the kernel ----------------------------------------------------------------------------

    async def interrupt(self, context_id: str | None = None) -> bool:
        """Interrupt the running execution (or withdraw one its gate holds); False when
        nothing was running (in context ``context_id``, if named)."""
        if context_id is not None:
            self._contexts.get(context_id)
        return self._interrupt(context_id)

    def _interrupt(self, context_id: str | None = None) -> bool:
        head = self._queue.head
        if head is None or context_id not in (None, head.context_id):
            return False
        withdrawn = self._queue.withdraw(context_id)  # held by its gate: withdraw it
        if withdrawn is not None:
            return withdrawn
        return bool(head.run and head.run.interrupt())

    # -- code contexts -------------------------------------------------------------------

    @property
    def languages(self) -> tuple[str, ...]:
        """The languages the session's image offers (``typescript`` beside ``javascript``)."""
        return self.kernel.sandbox.languages

    @property
    def contexts(self) -> dict[str, str]:
        """Its code contexts' languages by id (what a node tells gateways with its state)."""
        return {context.id: context.language for context in self._contexts}

    async def list_contexts(self) -> list[ContextInfo]:
        """The session's code contexts, its own Python kernel first."""
        return [context.info(self.execution_count if context.default else None)
                for context in self._contexts]

    async def create_context(self, language: str | None = None,
                             cwd: str | None = None) -> ContextInfo:
        """A new code context of ``language`` (its kernel starts at its first execution, in
        the folder ``cwd``: None, the workspace; a relative one is in the workspace).
        :class:`InvalidRequest` for a folder that is not there or not the sandbox user's to
        enter (asked of the sandbox now, not at the first execution)."""
        if self._closed:
            raise SessionClosed(self.id)
        folder = check_cwd(cwd)
        check_language(language, self.languages)
        if folder is not None:
            checked = await self.run_command(f"sh -c {shlex.quote(FOLDER_CHECK)} - "
                                             f"{shlex.quote(folder)}", timeout_s=30)
            why = folder_refusal(folder, checked.stdout)
            if why is not None:
                raise InvalidRequest(why)
        return self._contexts.create(language, self.languages, folder).info()

    async def restart_context(self, context_id: str) -> None:
        """A fresh kernel for one context (its variables gone, files and other contexts
        kept); the session's own (``python``) is :meth:`restart`."""
        context = self._contexts.get(context_id)
        if context.default:
            await self.restart()
            return
        if self._closed:
            raise SessionClosed(self.id)
        self._interrupt(context_id)
        async with self._lock:
            # Ended now, started at its next execution: no kernel runs unasked.
            await close_context(context)
            context.lost = None

    async def remove_context(self, context_id: str) -> None:
        """End a context's kernel and forget the context (not the session's own)."""
        context = self._contexts.pop(context_id)
        for handle in self._queue:
            if handle.context_id == context_id and handle.run is None:
                handle.withdrawn = "withdrawn: its code context was removed before it ran"
        self._interrupt(context_id)
        async with self._lock:
            await close_context(context)

    async def restart(self) -> None:
        """A fresh kernel on the same workspace: variables gone, files kept."""
        if self._closed:
            raise SessionClosed(self.id)
        # What waits in the queue is withdrawn, so the restart does not wait for all of it
        # to run first (up to the queue's length times the timeout); what is sent after it
        # runs on the fresh kernel.
        for handle in self._queue:
            if handle.run is None and handle.gating is None:
                handle.withdrawn = "withdrawn: the session was restarted before it ran"
        self._interrupt()
        self._restarting = True
        # A task of the session's own: ``close`` cancels and awaits it like an execution, so
        # a deletion during a restart neither hangs nor leaves a container made after it; and
        # a caller that goes away does not cut the restart half-way.
        restarting = self._queue.spawn(self._restart(), f"restart-{self.id}")
        try:
            await asyncio.shield(restarting)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if restarting.cancelled() and self._closed and not (task and task.cancelling()):
                raise SessionClosed(self.id) from None
            raise

    async def _restart(self) -> None:
        try:
            async with self._lock:
                if self._closed:
                    raise SessionClosed(self.id)
                if self.paused and self.lifecycle is not None:  # a fresh kernel: no snapshot
                    await self.lifecycle.reserve_slot(self)
                    if await self._stop_packing() is not None:
                        await self._forget_memory(self.lifecycle.snapshots, None)
                    self.pause_info = None
                    await anyio.to_thread.run_sync(self.lifecycle.snapshots.delete, self.id)
                await self.kernel.restart()
                self.execution_count = 0
        finally:
            self._restarting = False
            self._touch()

    async def relay(self, msg_type: str, content: dict[str, Any], *,
                    channel: str = "shell") -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Send one raw Jupyter request (``kernel_info_request``, ``complete_request``, ...)
        to the kernel beside the execution queue; yield ``(channel, message)`` for its reply
        and the iopub messages under it, parsed and signature-checked, until the kernel is
        idle again.

        Waits for a kernel that is (re)starting; :class:`KernelUnavailable` when it does not
        come back or dies before answering. Executions go through :meth:`submit`, never here.
        """
        kernel = await self._ready_kernel()
        async for item in kernel.relay(msg_type, content, channel,
                                       timeout_s=self.profile.max_timeout_s + 60):
            yield item
        if kernel.death is not None:
            raise KernelUnavailable(self.id, kernel.death.reason)

    async def _ready_kernel(self) -> Kernel:
        if self._closed:
            raise SessionClosed(self.id)
        if self.paused:  # a request that needs the kernel resumes the session
            await self.resume()
        try:
            async with asyncio.timeout(self._settings.kernel_start_timeout_s):
                await self.kernel.settled.wait()
        except TimeoutError:
            raise KernelUnavailable(self.id, "it did not come back within "
                                    f"{self._settings.kernel_start_timeout_s:g}s") from None
        if self._closed:
            raise SessionClosed(self.id)
        if self.kernel.state is not KernelState.READY:
            death = self.kernel.death
            raise KernelUnavailable(self.id, death.reason if death else self.kernel.state.value)
        return self.kernel

    # -- the workspace -------------------------------------------------------------------------

    async def _while_open(self, work: Callable[[], Awaitable[T]],
                          lost: tuple[type[Exception], ...] = (OSError,)) -> T:
        """``work()``; :class:`SessionClosed` once the session is deleted, also in place of
        a ``lost`` error when the deletion removed what it worked on (the workspace)."""
        if self._closed:
            raise SessionClosed(self.id)
        try:
            return await work()
        except lost:
            if self._closed:
                raise SessionClosed(self.id) from None
            raise

    async def _in_workspace(self, call: Callable[..., T], *args: Any) -> T:
        """``call(*args)`` in a worker thread on the workspace, while the session is open."""
        return await self._while_open(functools.partial(anyio.to_thread.run_sync, call, *args))

    async def read_file(self, path: str, limit: int) -> bytes:
        """The bytes of ``path`` in the workspace; :class:`FileMissing`, :class:`FileTooLarge`
        over ``limit`` bytes, :class:`PathOutsideWorkspace` for a path leaving it."""
        return await self._in_workspace(self.workspace.read_bytes, path, limit)

    async def write_file(self, path: str, data: bytes) -> int:
        """Create or replace ``path`` (parent folders too); the number of bytes written."""
        return await self._in_workspace(self.workspace.write_bytes, path, data)

    async def list_files(self) -> list[FileInfo]:
        """Every regular file of the workspace, recursively, paths relative to it."""
        return await self._in_workspace(self.workspace.list_files)

    async def stat_path(self, path: str) -> Entry:
        """What is at ``path`` (``""``: the workspace); a link is described, not followed."""
        return await self._in_workspace(self.workspace.stat, path)

    async def list_dir(self, path: str, depth: int = 1) -> list[Entry]:
        """The entries under the folder ``path``, ``depth`` levels down."""
        return await self._in_workspace(self.workspace.list_dir, path, depth)

    async def make_dir(self, path: str) -> bool:
        """Create the folder and its parents; False when it already exists."""
        return await self._in_workspace(self.workspace.make_dir, path)

    async def remove_path(self, path: str) -> None:
        """Delete a file, a link or a folder with everything in it."""
        await self._in_workspace(self.workspace.remove, path)

    async def move_path(self, source: str, destination: str) -> Entry:
        """Rename ``source`` to ``destination`` (its parent folders are created)."""
        return await self._in_workspace(self.workspace.move, source, destination)

    # -- the sandbox ---------------------------------------------------------------------------

    def sandbox_info(self) -> SandboxInfo:
        """What a restarted gateway needs to take this session's sandbox back."""
        return self.kernel.sandbox.get_info()

    async def usage(self) -> SandboxUsage:
        """The sandbox's CPU time, memory and workspace disk in use now, and its limits;
        :class:`SessionClosed` if the session was deleted meanwhile (its workspace gone)."""
        return await self._while_open(
            lambda: read_usage(self.kernel.sandbox, self.workspace, self.profile, self.paused),
            (OSError, BackendError))

    async def egress_attempts(self) -> list[EgressAttempt]:
        """The latest connection attempts through the sandbox's egress proxy (none without)."""
        egress = self.kernel.egress
        return egress.attempts if egress is not None else []

    async def close(self) -> None:
        """Stop everything and remove the sandbox (container and workspace)."""
        if self._closed:
            return
        self._closed = True
        await self._queue.cancel()
        if self._dump is not None:  # a memory pause's, its packing cancelled above
            with contextlib.suppress(Exception):
                await self.kernel.sandbox.discard_checkpoint(self._dump)
            self._dump = None
        for context in self._contexts:
            await close_context(context, kill=False)  # the container goes with the kernel's
        await self.kernel.close()
