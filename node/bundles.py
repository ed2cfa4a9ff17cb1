"""A node's paused sessions in shared storage (``REPLGATE_BUNDLE_STORE``), so that any node
resumes them (``docs/bundles.md``).

Every pause on the node (asked for, idle, to make room, or a drain's) writes the session's
bundle before it answers: its variables snapshot and its workspace's files, sealed with the
key of the session's tenant. The node learns the tenant from the session's row in the shared
database rather than from the gateways: forks and the node's own pauses need no tenant carried
to it, and a session placed on another node since is seen there (its bundle is then that
node's to write). Memory images stay on the node that took them (a CRIU image restores only on
a host like its own): a bundle keeps the variables, and says so in ``not_kept``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from common.store import Store
from kernel_pool import DEFAULT_CONTEXT, KernelPool, PauseInfo, Session, SessionPort
from kernel_pool.bundles import BundleInfo, Bundles, read_session, write_session

logger = logging.getLogger("replgate.node")

MEMORY_NOT_KEPT = "memory image"
"""The ``not_kept`` entry of a memory pause's bundle."""


class BundleKeeper:
    """Writes the bundles of ``pool``'s paused sessions into ``bundles`` and restores others'."""

    def __init__(self, node_id: str, pool: KernelPool, bundles: Bundles, store: Store) -> None:
        self.node_id = node_id
        self.pool = pool
        self.bundles = bundles
        self.store = store
        self._kept: set[str] = set()
        """The paused sessions whose bundle is their current pause's."""
        self._digests: dict[str, str] = {}
        self._restoring: dict[str, asyncio.Future[Session]] = {}
        """Restores under way, by session: two gateways asking at once get the same one."""
        pool.keep_paused = self.keep
        pool.on_session_resumed.append(self._resumed)

    def __repr__(self) -> str:
        return f"<BundleKeeper {self.node_id} {self.bundles!r}>"

    def kept(self, session_id: str) -> bool:
        """Whether the paused session's bundle holds its current pause."""
        return session_id in self._kept

    def _resumed(self, session: SessionPort) -> None:
        # Its bundle stays: a lost node's running sessions resume from their last pause.
        self._kept.discard(session.id)

    async def keep(self, session: Session) -> None:
        """Write the paused session's bundle. A failure leaves it paused here alone, its
        ``reason`` saying so (nothing else changes: it resumes on this node)."""
        info = session.pause_info
        if info is None:
            return
        try:
            record = await self.store.get_session(session.id)
            if record is None or record.deleted:
                raise LookupError("the session is not recorded in the shared database")
            if record.node not in (None, self.node_id):
                logger.info("session %s: not written to the bundle store: it was placed on "
                            "node %s since", session.id, record.node)
                return
            await write_session(self.bundles, record.tenant, session.id,
                                await self._bundle_info(session, info), self.pool.snapshots,
                                session.workspace)
        except Exception as exc:
            session.reason = (f"paused on node {self.node_id} only: its bundle could not be "
                              f"written to the bundle store ({exc}); it resumes on this node")
            logger.warning("session %s: %s", session.id, session.reason)
            return
        self._kept.add(session.id)

    async def _bundle_info(self, session: Session, info: PauseInfo) -> BundleInfo:
        image = session.profile.image
        if image not in self._digests:
            self._digests[image] = await self.pool.image_digest(image) or image
        variables = info.without_memory()
        not_kept = dict(variables.not_kept)
        if info.paused_with == "memory":
            not_kept[MEMORY_NOT_KEPT] = (
                f"the memory image stays on node {self.node_id}, where it was taken (it "
                "restores only on that host): another node resumes from the variables")
        contexts = {context_id: language for context_id, language in session.contexts.items()
                    if context_id != DEFAULT_CONTEXT}
        return BundleInfo(paused_with="variables", image_digest=self._digests[image],
                          kept=variables.kept, not_kept=not_kept, reseed=info.reseed,
                          contexts=contexts)

    async def keep_paused(self, session: Session) -> None:
        """Pause the session into shared storage: paused now (which writes its bundle), or,
        paused already, its bundle written if it does not hold this pause (a fork's paused
        copy, a pause made before a failure of the store)."""
        if not session.paused:
            await session.pause()
        elif session.id not in self._kept:
            await self.keep(session)

    async def restore(self, tenant: str, session_id: str, **session: Any) -> Session:
        """The session of ``tenant`` from its bundle, paused on this node (it resumes when
        first needed); ``session``: :meth:`KernelPool.restore_session`'s keywords.
        :class:`~kernel_pool.bundles.BundleNotFound` when it has none."""
        restoring = self._restoring.get(session_id)
        if restoring is None:
            restoring = asyncio.ensure_future(self._restore(tenant, session_id, **session))
            self._restoring[session_id] = restoring
            restoring.add_done_callback(lambda _: self._restoring.pop(session_id, None))
        return await asyncio.shield(restoring)

    async def _restore(self, tenant: str, session_id: str, **session: Any) -> Session:
        bundle = await self.bundles.open(tenant, session_id)
        restored = await self.pool.restore_session(
            lambda workspace: read_session(bundle, session_id, self.pool.snapshots, workspace),
            session_id=session_id, **session)
        self._kept.add(session_id)
        logger.info("session %s restored from its bundle of %s (paused on another node)",
                    session_id, bundle.manifest.created_at.isoformat())
        return restored

    async def forget(self, tenant: str, session_id: str) -> None:
        """The session ended: its bundle goes."""
        self._kept.discard(session_id)
        await self.bundles.delete(tenant, session_id)
