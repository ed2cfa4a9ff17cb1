"""Sessions whose node was lost or drained: found again, placed again, moved.

Every request names a session, and :meth:`~node.placement.RemoteNodes.find` reaches it on the
node the shared database says runs it. Where that node no longer has it (it is down, or it
restarted without it), :func:`find` places the session again: from its bundle when there is a
bundle store (as of its last pause), else on a fresh kernel with its id, its next execution
saying why. A paused session of a drained node moves to another node from its bundle when next
used. When two gateways place the same session at once, the database's epoch lets one win
(:meth:`~node.registry.Registry.move`) and the other takes that placement.

What this needs of the nodes is :class:`Nodes` (``RemoteNodes`` is the one implementation), so
this module does not import the placement that calls it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import Any, Protocol

from common.store import SessionRecord
from kernel_pool import KernelPoolError, NodeUnreachable, SessionNotFound, SessionStatus
from node.client import NodeClient
from node.records import SessionRecords
from node.registry import Registry
from node.remote import RemoteSession
from node.restore import NotRestored, RestoreSession, keep_on, moved_from

logger = logging.getLogger(__name__)


class Nodes(Protocol):
    """What recovery asks of the nodes (:class:`~node.placement.RemoteNodes`)."""

    registry: Registry
    records: SessionRecords
    bundles: bool
    """Whether sessions are kept in a bundle store (then they move between nodes)."""

    def is_down(self, node_id: str) -> bool: ...

    async def is_draining(self, node_id: str) -> bool: ...

    def forget(self, session_id: str) -> None: ...

    async def client(self, node_id: str) -> NodeClient: ...

    async def attach(self, session_id: str, node_id: str) -> RemoteSession: ...

    async def restore_session(self, request: RestoreSession, *,
                              exclude: Collection[str] = ()) -> RemoteSession: ...

    async def create_session(self, profile: str = "default", *,
                             env: dict[str, str] | None = None,
                             metadata: dict[str, Any] | None = None,
                             session_id: str | None = None, tenant: str = "",
                             lost: str | None = None,
                             exclude: Collection[str] = ()) -> RemoteSession: ...

    async def discard(self, session: RemoteSession) -> None: ...

    async def record_lifecycle(self, session: RemoteSession) -> None: ...


async def find(nodes: Nodes, session_id: str, tenant: str | None) -> RemoteSession:
    """The live session (of ``tenant``, when given: another tenant's is exactly as absent as a
    missing one), reached on its node, placed again if that node lost it, moved if it is
    drained.

    The shared database says whether it exists and where it runs (another gateway may have
    created, deleted or placed it again).
    """
    record = await nodes.records.get(session_id)
    if record is None or (tenant is not None and record.tenant != tenant) or record.deleted \
            or record.node is None:
        if record is not None and record.deleted:
            nodes.forget(session_id)
        raise SessionNotFound(session_id)
    try:
        if nodes.is_down(record.node):
            raise NodeUnreachable(session_id, f"its node {record.node} is down")
        session = await nodes.attach(session_id, record.node)
    except (SessionNotFound, NodeUnreachable) as exc:
        session = await _lost(nodes, record, exc)  # (which reads it again)
    else:
        if session.closing:  # being deleted here: as absent as its node may already say
            raise SessionNotFound(session_id)
        if nodes.bundles and await nodes.is_draining(record.node):
            await session.refresh()  # paused as of now, not as of this gateway's last look
            fresh = await nodes.records.store.get_session(session_id)  # its count, its epoch
            if session.paused and fresh is not None and fresh.node == record.node:
                session = await _move(nodes, fresh, session)
    session.tenant = record.tenant
    return session


async def pause_all(nodes: Nodes, node_id: str) -> None:
    """Pause a drained node's sessions (into the bundle store, when there is one: each moves
    to another node when next used)."""
    for session_id in await nodes.registry.sessions_of(node_id):
        try:
            session = await nodes.attach(session_id, node_id)
            if nodes.bundles:
                session.apply(await keep_on(session.client, session_id))
            elif not session.paused:
                await session.pause()
            await nodes.record_lifecycle(session)
        except Exception as exc:
            logger.warning("drain of node %s: session %s not paused: %s", node_id,
                           session_id, exc)


def _restore_request(record: SessionRecord, lost: str | None) -> RestoreSession:
    return RestoreSession(tenant=record.tenant, session_id=record.id,
                          profile=record.profile, env=record.env, metadata=record.metadata,
                          created_at=record.created_at,
                          execution_count=record.execution_count, lost=lost)


async def _move(nodes: Nodes, record: SessionRecord, session: RemoteSession) -> RemoteSession:
    """A paused session of a drained node, placed on another from its bundle (and its copy on
    the drained node removed). Where it cannot be (no bundle, no room elsewhere, a bundle
    refused), it stays paused where it is, and resumes there when used."""
    old = record.node or ""
    try:
        moved = await nodes.restore_session(_restore_request(record, None), exclude=[old])
    except (NotRestored, KernelPoolError) as exc:
        logger.warning("session %s stays on drained node %s: %s", record.id, old, exc)
        return session
    await _network_again(moved, record)
    placed = await _settle(nodes, record, moved)
    if placed is moved:
        logger.info("session %s moved from drained node %s to node %s", record.id, old,
                    moved.node)
        try:
            await moved_from(await nodes.client(old), record.id)
        except KernelPoolError as exc:  # it removes it as it stops, or when fenced
            logger.warning("session %s: its copy on node %s was not removed: %s",
                           record.id, old, exc)
    return placed


async def _settle(nodes: Nodes, record: SessionRecord, session: RemoteSession) -> RemoteSession:
    """Make ``session``, placed again, the session's placement (its epoch raised from the one
    ``record`` saw), or, when another gateway placed it first, that placement's."""
    if not await nodes.registry.move(record.id, session.node, record.epoch):
        winner = await nodes.records.store.get_session(record.id)
        if winner is None or winner.deleted or winner.node is None:
            await nodes.discard(session)
            raise SessionNotFound(record.id) from None
        if winner.node != session.node:  # (on the same node, it is the same copy)
            await nodes.discard(session)
        return await nodes.attach(record.id, winner.node)
    await nodes.record_lifecycle(session)
    return session


async def _lost(nodes: Nodes, record: SessionRecord,
                exc: SessionNotFound | NodeUnreachable) -> RemoteSession:
    """A session whose node no longer has it: placed again on a fresh kernel with its id, its
    next execution saying why (``restarted``, ``reason``), when its node is down or answers
    without it; otherwise ``exc`` stands (a node away for a moment, or a session it ended a
    moment ago)."""
    store = nodes.records.store
    node = await nodes.registry.get(record.node or "")
    fresh = await store.get_session(record.id)
    if fresh is None or fresh.deleted or fresh.node != record.node:
        if fresh is not None and not fresh.deleted and fresh.node is not None:
            return await nodes.attach(record.id, fresh.node)  # placed again meanwhile
        raise SessionNotFound(record.id) from None
    if isinstance(exc, NodeUnreachable) and (node is not None and node.state != "down"):
        raise exc
    if isinstance(exc, SessionNotFound) and node is not None and node.state == "up":
        # Up, and without it: it ended it a moment ago (its record is marked deleted right
        # after), or it restarted before it was declared down. Only the latter leaves the
        # record live for long.
        await asyncio.sleep(0.5)
        again = await store.get_session(record.id)
        if again is None or again.deleted:
            raise exc
    lost = f"its node {record.node} was lost (down since its heartbeat stopped)"
    session: RemoteSession | None = None
    refused = ""
    if nodes.bundles:
        # Paused, it kept everything in its bundle; running, it goes back to its last pause,
        # and its next execution says so.
        why = None if fresh.status == SessionStatus.PAUSED.value else (
            f"{lost}; the session resumed on another node from its last pause: variables "
            "and files are as they were then")
        try:
            session = await nodes.restore_session(_restore_request(fresh, why),
                                                  exclude=[record.node or ""])
        except NotRestored as exc:  # (a node or the store failing raises: tried again)
            if exc.refused:
                refused = f" (its bundle was refused: {exc})"
    if session is None:
        reason = (f"{lost}; the session starts again on another node with a fresh kernel: "
                  f"variables are gone, files too{refused}")
        logger.warning("session %s: %s", record.id, reason)
        session = await nodes.create_session(record.profile, env=record.env,
                                             metadata=record.metadata, session_id=record.id,
                                             tenant=record.tenant, lost=reason,
                                             exclude=[record.node or ""])
    else:
        logger.warning("session %s: %s; restored from its bundle on node %s", record.id,
                       lost, session.node)
    await _network_again(session, fresh)
    return await _settle(nodes, fresh, session)


async def _network_again(session: RemoteSession, record: SessionRecord) -> None:
    """A moved or recovered session's network policy, applied on its new node (kept in its
    record; the new node's proxy serves it). Failing, it has its profile's network: no wider."""
    if record.network is None:
        return
    try:
        await session.set_network(record.network)
    except Exception as exc:
        logger.error("session %s: its network policy was not applied on node %s: %s",
                     record.id, session.node, exc)
