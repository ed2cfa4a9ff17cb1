"""What every part of a session stands on: its fields, its status, its kernel's death, the
execution queue's events, interrupts, and the workspace calls' guard.

:class:`~kernel_pool._session.Session` is this base and the rooms built on it, one concept each
(transfers, pausing, resuming, files and commands, watches, code contexts), stacked in that
order so each calls only what is below it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import anyio.to_thread

from kernel_pool._channels import KernelDied, KernelState
from kernel_pool._commands import CommandRun
from kernel_pool._contexts import Contexts
from kernel_pool._handle import ExecutionHandle, utcnow
from kernel_pool._kernel import Kernel
from kernel_pool._queue import ExecutionQueue
from kernel_pool._snapshot import SnapshotStore
from kernel_pool._watch import DirWatch
from kernel_pool._workspace import Workspace
from kernel_pool.backends.base import SandboxInfo
from kernel_pool.config import PoolSettings, Profile
from kernel_pool.events import (
    DoneEvent,
    Event,
)
from kernel_pool.exceptions import SessionClosed
from kernel_pool.port import Listener, SessionPort, TransferListener
from kernel_pool.state import PauseInfo, SessionState, SessionStatus, Transfer

logger = logging.getLogger(__name__)

T = TypeVar("T")

S = TypeVar("S", contravariant=True)


class Lifecycle(Protocol[S]):
    """What a session needs from its pool to pause and resume: slots for running kernels.
    (``S``: the session's class, :class:`~kernel_pool.Session`.)"""

    snapshots: SnapshotStore

    @property
    def checkpoint_refusal(self) -> str | None:
        """Why the backend cannot checkpoint a sandbox (a memory pause); None when it can."""

    async def reserve_slot(self, session: S) -> None:
        """Make room for the session's kernel to run (pausing another), or CapacityError."""

    def release_slot(self, session: S) -> None:
        """The session's kernel stopped running (paused): its slot is free."""

    async def take_warm(self, session: S) -> Kernel | None:
        """A warm kernel of the session's profile to resume onto (idle, or the next one a
        refill under way brings up), or None."""

    def give_back(self, kernel: Kernel) -> None:
        """Remove a kernel ``take_warm`` gave or one the session no longer uses."""

    def resumed(self, session: S) -> None:
        """The session runs again (on a new sandbox, perhaps): the pool tells its listeners."""

    async def paused_here(self, session: S) -> None:
        """The session is paused (its snapshot written, its kernel stopped or checkpointed):
        kept elsewhere too where the pool is told to (a node's bundle store), before the
        pause answers and before anything may resume it (the session's lock is held)."""

    async def resumed_here(self, session: S) -> None:
        """The session runs again: noted where the pool is told to (a node records it in the
        shared database) before any code runs (the session's lock is held)."""


class SessionBase:
    """A session's state and the calls every room uses (see the module's docstring)."""

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
        self._queue = ExecutionQueue(self.as_port)
        self._closed = False
        self._restarting = False
        self._packing: asyncio.Task[None] | None = None
        """A memory pause's packing, in the background after the pause answered."""
        self._dump: Path | None = None
        """That pause's dump while it is not packed (restorable from as it is)."""
        self.listeners: list[Listener] = self._queue.listeners
        self.commands: dict[str, CommandRun] = {}
        """Shell commands running now, by id (:meth:`run_command`)."""
        self.watches: dict[str, DirWatch] = {}
        """Folders watched now, by id (``watch_dir``); a pause or the end ends them."""
        self.lifecycle: Lifecycle[Any] | None = None
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

    @property
    def as_port(self) -> SessionPort:
        """This session as its listeners are told of it: a :class:`~kernel_pool.Session`,
        the only class built on this base, which the rooms above make a whole port."""
        return cast("SessionPort", self)

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
            node=self.node, tenant=self.tenant, network=self.kernel.network)

    async def refresh(self) -> None:
        """Nothing to ask: its state is read where it is kept, in this process."""

    def idle_for(self) -> float:
        # A shell command running is activity: no idle pause or cull may end it unseen.
        return 0.0 if self._queue or self.commands else time.monotonic() - self._active_mono

    def age(self) -> float:
        return time.monotonic() - self._created_mono

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

    def _publish(self, handle: ExecutionHandle, event: Event) -> None:
        if isinstance(event, DoneEvent):
            event.language = handle.language
        self._queue.publish(handle, event)

    def _touch(self) -> None:
        self._active_mono = time.monotonic()
        self.last_active_at = utcnow()

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

    @property
    def languages(self) -> tuple[str, ...]:
        """The languages the session's image offers (``typescript`` beside ``javascript``)."""
        return self.kernel.sandbox.languages

    @property
    def contexts(self) -> dict[str, str]:
        """Its code contexts' languages by id (what a node tells gateways with its state)."""
        return {context.id: context.language for context in self._contexts}

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

    def sandbox_info(self) -> SandboxInfo:
        """What a restarted gateway needs to take this session's sandbox back."""
        return self.kernel.sandbox.get_info()
