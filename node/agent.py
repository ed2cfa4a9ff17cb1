"""``replgate node``: one host's kernel pool, serving the port to gateways over mutual TLS.

The node registers itself in the shared database (its id, the address gateways reach it on,
its capacity) and beats there every third of ``REPLGATE_NODE_TIMEOUT_S``. What it does to its
sessions by itself (culling, idle pauses) it records there too, so gateways that hold no state
of their own see it. A node that learns it was declared down (its heartbeat was late: the
gateways placed its sessions elsewhere) removes every session it had and starts afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
from fastapi import FastAPI

from common.database import DatabaseError
from common.policy import load_policy
from common.settings import Settings
from common.startup import StartupRefused, serve_guarded
from common.store import RecordNotFound, Store
from common.tracing import setup_tracing
from kernel_pool import KernelPool, SessionPort
from kernel_pool.bundles import Bundles
from kernel_pool.config import BundleSettings
from kernel_pool.exceptions import BackendError
from node.bundles import BundleKeeper
from node.registry import Fenced, NodeIdTaken, Registry
from node.restore import MOVED
from node.server import create_node_app
from node.tls import uvicorn_ssl_options

logger = logging.getLogger("replgate.node")

FENCED = "fenced"
"""The reason a node removes the sessions it had when it learns it was declared down."""


class NodeAgent:
    """The node's books in the shared database: registration, heartbeat, sessions it ended."""

    def __init__(self, node_id: str, advertise: str, pool: KernelPool, store: Store,
                 registry: Registry, beat_s: float, keeper: BundleKeeper | None = None) -> None:
        self.node_id = node_id
        self.keeper = keeper
        """Where its paused sessions are kept for other nodes (None: no bundle store)."""
        self.stopping = False
        """Set as the node stops: the sessions its pool closes then are placed again by the
        gateways when next used (paused ones from their bundles), not ended."""
        self.advertise = advertise
        self.pool = pool
        self.store = store
        self.registry = registry
        self.beat_s = beat_s
        self._tasks: set[asyncio.Task[Any]] = set()
        pool.on_session_closed.append(self._closed)
        pool.on_session_paused.append(self._lifecycle)
        pool.keep_resumed = self._resumed

    async def register(self) -> None:
        await self.registry.register(self.node_id, self.advertise, self.pool.settings.max_kernels)
        logger.info("node %s registered at %s (%d kernels at most)", self.node_id,
                    self.advertise, self.pool.settings.max_kernels)

    async def beat(self) -> None:
        """Heartbeats until cancelled; a fenced node drops its sessions and registers again."""
        while True:
            await asyncio.sleep(self.beat_s)
            stats = self.pool.stats()
            try:
                await self.registry.heartbeat(self.node_id, self.advertise,
                                              kernels=stats["in_use"] + stats["idle"],
                                              sessions=stats["sessions"])
            except Fenced as fenced:
                logger.warning("%s; removing its sessions here", fenced)
                for session_id in list(self.pool.sessions):
                    with contextlib.suppress(Exception):
                        await self.pool.delete_session(session_id, reason=FENCED)
                try:
                    await self.register()
                except NodeIdTaken as taken:
                    # Another node runs under this id now: serving on would only confuse
                    # the gateways, so this process stops (as SIGTERM stops it).
                    logger.error("%s; stopping", taken)
                    os.kill(os.getpid(), signal.SIGTERM)
                    return
            except Exception as exc:  # the database away for a moment: beat again later
                logger.warning("heartbeat of node %s failed: %s", self.node_id, exc)

    def _closed(self, session: SessionPort, reason: str) -> None:
        if self.stopping:
            return
        self._spawn(self._record_closed(session.id, reason))

    async def _record_closed(self, session_id: str, reason: str) -> None:
        """The books of a session the node no longer holds: ended (its record marked deleted,
        its bundle removed) unless it lives on elsewhere (placed on another node, or to be
        placed again: this node was declared down)."""
        record = await self.store.get_session(session_id)
        elsewhere = reason in (MOVED, FENCED) or (
            record is not None and record.node not in (None, self.node_id))
        if not elsewhere:
            with contextlib.suppress(RecordNotFound):  # never recorded: a fork's failed copy
                await self.store.mark_deleted(session_id)
            if self.keeper is not None and record is not None:
                await self.keeper.forget(record.tenant, session_id)
        await self.registry.release(self.node_id)
        logger.info("session %s %s node %s: %s", session_id,
                    "left" if elsewhere else "ended on", self.node_id, reason)

    async def _resumed(self, session: SessionPort) -> None:
        """Recorded before the resumed session runs code: a node lost right after must leave
        the record saying it ran past its last pause (it then restarts from that pause, and
        says so), never paused (it would claim to have kept everything)."""
        try:
            await self.store.update_session(
                session.id, status=session.state().status.value,
                sandbox=session.sandbox_info().model_dump(mode="json"))
        except Exception as exc:  # the database away: the resume stands, its record lags
            logger.warning("session %s: its resume was not recorded: %s", session.id, exc)

    def _lifecycle(self, session: SessionPort) -> None:
        self._spawn(self.store.update_session(
            session.id, status=session.state().status.value,
            sandbox=session.sandbox_info().model_dump(mode="json")))

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("node %s: recording failed: %s", self.node_id, task.exception())


def run_node(settings: Settings, *, node_id: str, advertise: str, sock: socket.socket) -> None:
    """Serve the port on ``sock`` until stopped (SIGTERM, SIGINT)."""
    if settings.database_url is None:
        raise ValueError("replgate node needs REPLGATE_DATABASE_URL: the PostgreSQL database "
                         "its gateways share")
    if settings.tls_ca is None or settings.tls_cert is None or settings.tls_key is None:
        raise ValueError("replgate node needs REPLGATE_TLS_CA, REPLGATE_TLS_CERT and "
                         "REPLGATE_TLS_KEY: gateways and nodes talk over mutual TLS only")
    policy = load_policy(settings.policy_file)
    bundles = Bundles.from_settings(BundleSettings(store=settings.bundle_store,
                                                   key=settings.bundle_key))
    limits = settings.pool.model_copy(update={"owner": node_id})  # nodes share an engine
    # A stopped node's sessions are placed again by the gateways (a node takes none back
    # when it starts): its sandboxes go with it.
    pool_settings = policy.pool_settings(settings.model_copy(
        update={"pool": limits, "keep_sessions_on_stop": False}).pool_settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await anyio.to_thread.run_sync(
            lambda: settings.state_dir.mkdir(parents=True, exist_ok=True))
        async with Store.open(settings.database) as store:
            registry = Registry(store.database, heartbeat_timeout_s=settings.node_timeout_s)
            await registry.check_free(node_id, advertise)  # before any container starts
            await pool.start()  # what a previous life left here is removed: it was placed anew
            await pool.remove_leftovers()  # (and what its paused sessions left without a container)
            keeper = app.state.bundles = (
                BundleKeeper(node_id, pool, bundles, store) if bundles is not None else None)
            agent = NodeAgent(node_id, advertise, pool, store, registry,
                              beat_s=settings.node_timeout_s / 3, keeper=keeper)
            await agent.register()
            beating = asyncio.create_task(agent.beat())
            try:
                yield
            finally:
                beating.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beating
                agent.stopping = True
                await pool.close()

    pool = KernelPool(pool_settings)
    # Saved snapshots go where every node reads them, or nowhere (refused with a sentence).
    pool.snapshot_bundles = bundles
    # Spans of the node's requests join the gateway's trace (its httpx calls carry the
    # traceparent): an execution's trace shows the hop and the node's side of it.
    tracing = setup_tracing()
    app = create_node_app(pool, node_id, settings.limits.image, lifespan=lifespan,
                          tracing=tracing, images=bundles.store if bundles is not None else None)
    # The channel's messages are executions' code, which the gateway bounds (max_code_bytes).
    # A node id taken, a database that cannot be used, a runtime the engine lacks: said as
    # the command's own error (status 2), without a traceback in the log.
    refused = serve_guarded(app, (NodeIdTaken, DatabaseError, BackendError), sock,
                            log_config=None, timeout_graceful_shutdown=10,
                            ws_max_size=64 * 1024 * 1024, ws_per_message_deflate=False,
                            timeout_keep_alive=settings.http_keep_alive_s,
                            **uvicorn_ssl_options(settings.tls_cert, settings.tls_key,
                                                  settings.tls_ca))
    if refused is not None:
        raise StartupRefused(refused)
