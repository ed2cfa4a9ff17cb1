"""Resuming a paused session (in place, onto a warm kernel, or from a memory image) and
restarting one (a fresh kernel on the same workspace).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import anyio.to_thread

from kernel_pool._caused import caused
from kernel_pool._channels import KernelState
from kernel_pool._contexts import close_context
from kernel_pool._copies import copy_workspace
from kernel_pool._handle import ExecutionHandle
from kernel_pool._kernel import Kernel
from kernel_pool._languages import display_language
from kernel_pool._pausing import SessionPausing
from kernel_pool._snapshot import SnapshotStore, load_variables
from kernel_pool.events import (
    DoneEvent,
    ErrorEvent,
    ExecutionStatus,
)
from kernel_pool.exceptions import SessionClosed

logger = logging.getLogger(__name__)

WARM_RESUME_MAX_BYTES = 64 * 1024 * 1024
"""Workspaces up to this size are copied onto a warm kernel on resume; larger ones get a new
container on their own workspace (no copy)."""


def _why(exc: BaseException) -> str:
    """What a failed resume says: the error's words, or that the caller cancelled it."""
    if isinstance(exc, asyncio.CancelledError):
        return "it was cancelled"
    return str(exc) or type(exc).__name__


class SessionResuming(SessionPausing):
    """Resume and restart."""

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
        if (boot := self._kept_boot()) is not None:
            await self.kernel.sandbox.resume_boot(boot)
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
            if (boot := self._kept_boot()) is not None:
                await warm.sandbox.resume_boot(boot)
            await anyio.to_thread.run_sync(copy_workspace, self.workspace,
                                           warm.sandbox.workspace)
            if self.env:
                warm.env = dict(self.env)
                await warm.publish_env()
            await self._transferring("resume", load_variables(
                warm, store, self.id, reseed, progress=self._progress))
        except BaseException:
            self.lifecycle.give_back(warm)
            raise
        old, self.kernel = self.kernel, warm
        warm.on_death = self._kernel_died
        try:
            if old.network is not None:  # read at the swap: one set meanwhile is not lost
                await warm.set_network(old.network, self.id, tenant=self.tenant)
        finally:
            if warm.egress is not None:
                warm.egress.session_id = self.id
            self.lifecycle.give_back(old)  # its container is gone; this removes its workspace

    def _kept_boot(self) -> str | None:
        """The boot id the resume keeps: the sandbox's as it paused (a fork's copy that
        never ran boots with its own)."""
        info = self.pause_info
        return info.boot_id if info is not None and not info.reseed else None

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
