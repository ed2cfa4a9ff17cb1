"""New sessions: on a warm kernel, as a fork's copies (running or paused), or restored from
what another pool kept (a node's bundle).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio.to_thread

from kernel_pool._channels import KernelState
from kernel_pool._copies import copy_workspace
from kernel_pool._kernel import Kernel
from kernel_pool._session import Session
from kernel_pool._slots import Slots
from kernel_pool._snapshot import load_variables
from kernel_pool._workspace import Workspace
from kernel_pool.backends.base import (
    Sandbox,
    SandboxSpec,
)
from kernel_pool.config import Profile
from kernel_pool.exceptions import BackendError
from kernel_pool.state import PauseInfo


class Forks(Slots):
    """Create, fork and restore sessions."""

    async def create_session(self, profile: str = "default", *, env: dict[str, str] | None = None,
                             metadata: dict[str, Any] | None = None,
                             session_id: str | None = None, tenant: str = "",
                             admitted: Awaitable[None] | None = None,
                             lost: str | None = None) -> Session:
        """A session on a warm kernel (a hand-off: milliseconds when one is idle), of
        ``tenant``; ``admitted`` is awaited first (it raises what refuses one more session).

        ``lost``: why this session, known elsewhere before, starts again on a fresh kernel (its
        node was lost): its first execution says so (``restarted``, ``reason``).
        """
        if admitted is not None:
            await admitted
        session = await self._open_session(await self.acquire(profile), env=env,
                                           metadata=metadata, session_id=session_id,
                                           tenant=tenant)
        session._lost = lost
        return session

    async def _open_session(self, kernel: Kernel, *, env: dict[str, str] | None,
                            metadata: dict[str, Any] | None,
                            session_id: str | None = None, tenant: str = "") -> Session:
        """A session on an acquired kernel (released if this fails)."""
        try:
            if env:
                kernel.env = dict(env)
                await kernel.publish_env()
        except BaseException:
            await self.release(kernel)
            raise
        session = Session(kernel, kernel.profile, self.settings, session_id=session_id, env=env,
                          metadata=metadata, tenant=tenant)
        session.lifecycle = self
        self._sessions[session.id] = session
        return session

    async def fork_session(self, parent_id: str, count: int = 1,
                           metadata: dict[str, Any] | None = None) -> list[Session]:
        """``count`` new sessions, each with the parent's variables (random generators
        reseeded) and a copy of its workspace; the parent goes on unchanged. All or none.

        Copies take the idle warm kernels. The others, where the backend can make a sandbox
        without starting it, are paused copies (the parent's snapshot and files, no process)
        that resume on first use like any paused session: a fork waits for no kernel boot
        and is not bounded by ``max_kernels``. Otherwise kernels are started for them.
        """
        parent = self.get_session(parent_id)
        # The parent's variables, stored once for every copy (streamed into each).
        key = f"{parent.id}-fork-{uuid.uuid4().hex[:12]}"
        try:
            info = await parent.snapshot(key)
            return await self._fork(parent, key, info, count, metadata)
        finally:
            await anyio.to_thread.run_sync(self.snapshots.delete, key)

    async def _fork(self, parent: Session, key: str, info: PauseInfo, count: int,
                    metadata: dict[str, Any] | None) -> list[Session]:
        profile = parent.profile
        children: list[Session] = []
        held = {parent.id}  # making room for a copy must not pause the parent or a copy
        self._held |= held

        async def one() -> None:
            # Decided in each copy's first step, before any await: the first copies take the
            # idle kernels, and the warm pool's refill waits for the fork (below) instead of
            # booting kernels beside the ones it starts.
            kernel = self._pop_warm(profile.name)
            if kernel is None and self.backend.stopped_sandboxes:
                await self._paused_copy(parent, key, info, metadata, children)
                return
            if kernel is None:
                kernel = await self.acquire(profile.name, refill=False)
            child = await self._open_session(kernel, env=parent.env, metadata=metadata,
                                             tenant=parent.tenant)
            children.append(child)
            if parent.network is not None:  # a fork inherits the policy
                await child.set_network(parent.network)
            held.add(child.id)
            self._held.add(child.id)
            await anyio.to_thread.run_sync(copy_workspace, parent.workspace, child.workspace)
            await load_variables(child.kernel, self.snapshots, key, reseed=True)

        try:
            # Every copy's outcome is awaited, so a failure leaves none half-made behind.
            outcomes = await asyncio.gather(*(one() for _ in range(count)),
                                            return_exceptions=True)
            failed = [o for o in outcomes if isinstance(o, BaseException)]
            if failed:
                for child in children:
                    await self._close_session(child, "its fork failed")
                raise failed[0]
        finally:
            self._held -= held
            self._fill(profile.name)
        return children

    async def _paused_copy(self, parent: Session, key: str, info: PauseInfo,
                           metadata: dict[str, Any] | None, children: list[Session]) -> None:
        """A paused copy of ``parent`` (appended to ``children`` as soon as it exists, for the
        fork to remove on failure): a sandbox made without starting it, the parent's files in
        its workspace and a copy of snapshot ``key`` under its id, to be loaded reseeded when
        it resumes."""
        spec = SandboxSpec(sandbox_id=uuid.uuid4().hex[:12], profile=parent.profile,
                           env=parent.env)
        with self._being_made(spec):
            sandbox = await self.backend.create_stopped(spec)
            child = self._stopped_session(sandbox, parent.profile, env=parent.env,
                                          metadata=metadata, tenant=parent.tenant)
            child.kernel.network = parent.network  # served when it first resumes
        children.append(child)
        await anyio.to_thread.run_sync(copy_workspace, parent.workspace, sandbox.workspace)
        child.pause_info = await anyio.to_thread.run_sync(
            self.snapshots.copy, key, child.id, info.model_copy(update={"reseed": True}))
        await sandbox.release()  # lean from the start: its image holds its files alone

    def _stopped_session(self, sandbox: Sandbox, profile: Profile, *,
                         env: dict[str, str] | None, metadata: dict[str, Any] | None,
                         session_id: str | None = None, tenant: str = "") -> Session:
        """A paused session on a sandbox where nothing runs; it resumes when first needed."""
        kernel = self._new_kernel(sandbox, profile)
        kernel.env = dict(env or {})
        kernel.state = KernelState.PAUSED
        session = Session(kernel, profile, self.settings, session_id=session_id, env=env,
                          metadata=metadata, tenant=tenant)
        session.lifecycle = self
        self._sessions[session.id] = session
        return session

    async def restore_session(self, fill: Callable[[Workspace], Awaitable[PauseInfo]], *,
                              session_id: str, profile: str = "default",
                              env: dict[str, str] | None = None,
                              metadata: dict[str, Any] | None = None,
                              created_at: str | None = None, execution_count: int = 0,
                              lost: str | None = None, tenant: str = "") -> Session:
        """A paused session made from what another pool kept of it (a node's bundle): a
        sandbox made without starting it, ``fill`` puts the files in its workspace and the
        variables snapshot in :attr:`snapshots` under ``session_id`` (what it keeps returned);
        the session resumes when first needed. ``lost``: see :meth:`create_session`. On any
        failure nothing of it is left."""
        chosen = self.profile(profile)
        if not self.backend.stopped_sandboxes:
            raise BackendError(f"the {self.backend.name} backend cannot make a sandbox without "
                               "starting it, which a restored session needs")
        spec = SandboxSpec(sandbox_id=uuid.uuid4().hex[:12], profile=chosen, env=env or {})
        with self._being_made(spec):
            sandbox = await self.backend.create_stopped(spec)
            kernel = self._new_kernel(sandbox, chosen)
        try:
            info = await fill(sandbox.workspace)
            await sandbox.release()  # lean from the start: its image holds its files alone
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(kernel.close())
            await anyio.to_thread.run_sync(self.snapshots.delete, session_id)
            raise
        kernel.env = dict(env or {})
        kernel.state = KernelState.PAUSED
        session = Session(kernel, chosen, self.settings, session_id=session_id, env=env,
                          metadata=metadata, tenant=tenant)
        session.lifecycle = self
        session.pause_info = info
        session.recall_contexts()
        session._lost = lost
        if created_at:
            session.created_at = created_at
        session.execution_count = execution_count
        self._sessions[session.id] = session
        return session
