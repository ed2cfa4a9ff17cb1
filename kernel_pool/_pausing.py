"""Pausing a session: its variables (and, with a memory pause, the whole sandbox) kept, its
kernel stopped; the shell commands and code contexts it ends; a memory dump's packing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import anyio.to_thread

from kernel_pool._caused import caused
from kernel_pool._channels import KernelState
from kernel_pool._contexts import (
    CodeContext,
    close_context,
)
from kernel_pool._languages import display_language
from kernel_pool._snapshot import (
    STOPPED_COMMAND,
    SnapshotStore,
    context_entry,
    save_variables,
)
from kernel_pool._transfers import SessionTransfers
from kernel_pool._watch import end_watches
from kernel_pool.exceptions import (
    BackendError,
    SessionClosed,
    SnapshotError,
)
from kernel_pool.state import KeptContext, PauseInfo

logger = logging.getLogger(__name__)

# A pause stops the shell commands running beside the kernel: how long it waits for them to
# end, and how much of each one's text names it in ``not_kept``.
COMMANDS_END_WAIT_S = 5.0
COMMAND_SHOWN = 80


class SessionPausing(SessionTransfers):
    """Pause, snapshot (for a fork), and taking back a paused session's memory pause."""

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
        await end_watches(self.watches, "the session was paused")
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
            try:
                await asyncio.shield(self._forget_memory(store, info))
            finally:
                # Shown once its record says so: a client that sees the variables pause
                # and reads the state directory finds it written, not half-way.
                self.pause_info = info
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
