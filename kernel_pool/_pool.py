"""The warm pool: kernels started ahead of need, handed to sessions in a dictionary pop.

Like httpcore's connection pool, every decision (take an idle kernel, reserve a slot to start
one, refuse at capacity) is made in a synchronous, I/O-free step, so concurrent callers can
never over-commit; the I/O that follows (starting a container) runs in its own task, shielded
from a caller's cancellation, and a kernel nobody waits for any more joins the idle set.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import ClassVar

import anyio.to_thread

from kernel_pool._adoption import Adoption
from kernel_pool._channels import KernelState
from kernel_pool._handle import utcnow
from kernel_pool._network import guard
from kernel_pool._session import Session
from kernel_pool._slots import ROOM_GRACE_S
from kernel_pool.backends.base import SandboxInfo
from kernel_pool.exceptions import (
    NotDrainable,
    SessionNotFound,
)
from kernel_pool.state import NodeRecord, SessionStatus

logger = logging.getLogger(__name__)


class KernelPool(Adoption):
    """Warm kernels per profile, capped in total, and the sessions that own kernels.

    It is the :class:`~kernel_pool.SessionHost` of one machine: its one node is this process,
    named by the settings' ``owner`` label.
    """

    first_epoch: ClassVar[int] = 0
    """Its sessions are never placed: their records start at epoch 0."""

    async def start(self, keep: Callable[[SandboxInfo], bool] | None = None) -> list[SandboxInfo]:
        """Remove sandboxes an earlier run left behind (those ``keep`` rejects), then fill.

        Returns the infos of the sandboxes kept, for the caller to re-adopt.
        """
        await self.backend.check(list(self.settings.profiles.values()))
        await guard(self.settings.egress_guarded)  # the cluster's own: no policy reaches them
        await anyio.to_thread.run_sync(self.snapshots.remove_partials)
        kept = []
        for info in await self.backend.list_sandboxes():
            if keep is not None and keep(info):
                kept.append(info)
                continue
            logger.info("removing orphaned sandbox %s", info.sandbox_id)
            await self.backend.remove(info)
        self._spawn(self._cull_loop(), "the cull loop")
        for name in self.settings.profiles:
            self._fill(name)
        return kept

    async def close(self) -> None:
        """Close every session and warm kernel: nothing is left running."""
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        for name in self._waiters:  # their refills were cancelled: nothing will come
            self._wake(name, None, every=True)
        for session in list(self._sessions.values()):
            if self.settings.keep_sessions_on_close:
                await self._keep_session(session)
            else:
                with contextlib.suppress(Exception):  # logged, and tried again below
                    await self._close_session(session, "gateway shut down")
        for queue in self._idle.values():
            while queue:
                await self._remove(queue.popleft())
        # Kernels a cancelled task was starting or closing: close() waits for (or does) that.
        for kernel in list(self._kernels):
            if kernel.state not in (KernelState.DETACHED, KernelState.PAUSED):  # kept
                await self._remove(kernel)
        await self._remove_again()  # what is still left, the next start's sweep removes
        await self.backend.close()
        self._context.term()

    async def _keep_session(self, session: Session) -> None:
        """Leave a session for the next gateway: running kernels go on running (it takes them
        back), paused ones stay in their snapshots."""
        self._sessions.pop(session.id, None)
        self._in_use.discard(session.kernel)
        if session.kernel.state is KernelState.READY:
            try:
                await session.kernel.detach()
                return
            except Exception as exc:
                logger.warning("session %s: could not leave it running (%s)", session.id, exc)
        if session.paused:
            await session.packed()  # a memory pause's archive, for the next gateway
            await session.kernel.settle()
        else:
            await session.close()

    async def find(self, session_id: str, *, tenant: str | None = None) -> Session:
        """The session, if ``tenant``'s (when named); SessionNotFound otherwise."""
        session = self._sessions.get(session_id)
        if session is None or (tenant is not None and session.tenant != tenant):
            raise SessionNotFound(session_id)
        return session

    async def tenant_of(self, session_id: str) -> str | None:
        session = self._sessions.get(session_id)
        return session.tenant if session is not None else None

    async def list_sessions(self, tenant: str | None = None) -> list[Session]:
        return [session for session in self._sessions.values()
                if tenant is None or session.tenant == tenant]

    async def count_sessions(self, tenant: str | None = None) -> int:
        return len(await self.list_sessions(tenant))

    async def nodes(self) -> list[NodeRecord]:
        """This process, the one node of one machine, as a node's heartbeat would show it."""
        stats = self.stats()
        return [NodeRecord(id=self.settings.owner, address=self.address, state="up",
                           kernels=stats["idle"] + stats["in_use"],
                           max_kernels=self.settings.max_kernels, sessions=stats["sessions"],
                           heartbeat_at=utcnow())]

    async def drain(self, node_id: str, draining: bool) -> NodeRecord:
        """Refused: :class:`~kernel_pool.NotDrainable` (one machine has nowhere to drain to)."""
        raise NotDrainable

    async def _cull_loop(self) -> None:
        interval = self.settings.cull_interval_s
        if self.settings.pause_after_s:
            interval = min(interval, max(self.settings.pause_after_s / 2, 0.5))
        while True:
            await asyncio.sleep(interval)
            await self._remove_again()
            for session in list(self._sessions.values()):
                if session.idle_for() > self.settings.idle_ttl_s:
                    reason = f"idle for more than {self.settings.idle_ttl_s:g}s"
                elif session.age() > self.settings.max_lifetime_s:
                    reason = f"older than the maximum lifetime of {self.settings.max_lifetime_s:g}s"
                else:
                    pause_after = self.settings.pause_after_s
                    if (pause_after and session.idle_for() > pause_after
                            and session.status is SessionStatus.IDLE
                            and session.id not in self._held and not session.pause_failed):
                        self._spawn(self._pause(session, f"after {pause_after:g}s idle"),
                                    f"pausing idle session {session.id}")
                    continue
                logger.info("culling session %s: %s", session.id, reason)
                with contextlib.suppress(Exception):  # logged, and tried again (above)
                    await self._close_session(session, reason)
            # Sessions grew since they started, or the host's other work did: idle ones go to
            # disk, the least recently used first, before the OOM killer picks a kernel at
            # work. Then the warm kernels a shortage held back are started again.
            tried: set[str] = set()
            while self._memory_short() and await self._make_room(None, tried, ROOM_GRACE_S):
                pass
            for name in list(self.settings.profiles):
                self._fill(name)
