"""Taking back what an earlier gateway left: its sessions' sandboxes (running or paused), and
removing the rest.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kernel_pool._pool_snapshots import PoolSnapshots
from kernel_pool._session import Session
from kernel_pool.backends.base import SandboxInfo
from kernel_pool.exceptions import (
    BackendError,
    CapacityError,
)

logger = logging.getLogger(__name__)


class Adoption(PoolSnapshots):
    """Adopt left sessions and remove left sandboxes."""

    async def adopt_paused_session(self, info: SandboxInfo, *, session_id: str,
                                   env: dict[str, str] | None = None,
                                   metadata: dict[str, Any] | None = None,
                                   created_at: str | None = None,
                                   execution_count: int = 0, tenant: str = "") -> Session:
        """Take back a session an earlier gateway paused: it stays paused (no kernel runs)
        until something needs it, and resumes from its snapshot then."""
        profile = self.profile(info.profile)
        if self.snapshots.info(session_id) is None:
            raise BackendError(f"session {session_id} has no snapshot to resume from")
        sandbox = await self.backend.load_stopped(info, profile, env or {})
        session = self._stopped_session(sandbox, profile, env=env, metadata=metadata,
                                        session_id=session_id, tenant=tenant)
        session.pause_info = self.snapshots.info(session_id)
        await session.take_back()
        if created_at:
            session.created_at = created_at
        session.execution_count = execution_count
        return session

    async def adopt_session(self, info: SandboxInfo, *, session_id: str,
                            env: dict[str, str] | None = None,
                            metadata: dict[str, Any] | None = None,
                            created_at: str | None = None, execution_count: int = 0,
                            tenant: str = "") -> Session:
        """Take back a session whose sandbox a previous gateway left running (see ``start``).

        Its kernel keeps its variables when it is still running; otherwise a fresh kernel starts
        on the same workspace.
        """
        profile = self.profile(info.profile)
        if self._total() >= self.settings.max_kernels:
            raise CapacityError(profile.name, self.settings.max_kernels)
        sandbox = await self.backend.load(info, profile)
        kernel = self._new_kernel(sandbox, profile)
        kernel.env = dict(env or {})
        self._in_use.add(kernel)
        try:
            await kernel.start(attach=True)
        except BaseException:
            self._in_use.discard(kernel)
            await asyncio.shield(kernel.close())
            raise
        session = Session(kernel, profile, self.settings, session_id=session_id, env=env,
                          metadata=metadata, tenant=tenant)
        session.lifecycle = self
        if created_at:
            session.created_at = created_at
        session.execution_count = execution_count
        self._sessions[session.id] = session
        return session

    async def remove_sandbox(self, info: SandboxInfo) -> None:
        """Remove a sandbox ``start`` kept that will not be taken back: container, workspace."""
        await self.backend.remove(info)

    async def remove_leftovers(self) -> None:
        """Remove every sandbox on the host that no kernel or session of this pool uses: what
        a gateway killed while making one left (folders, mounts, but no container for
        :meth:`start` to find). Call it once the sessions to keep are taken back."""
        found = await self.backend.list_on_host()
        used = self._making | {kernel.sandbox.info.sandbox_id for kernel in self._kernels}
        for info in found:
            if info.sandbox_id not in used:
                logger.info("removing what sandbox %s left on the host", info.sandbox_id)
                self._unremoved[info.sandbox_id] = info
        await self._remove_again()

    async def image_digest(self, image: str) -> str | None:
        """The content id of ``image`` as the backend has it (for the audit log), if known."""
        return await self.backend.image_digest(image)
