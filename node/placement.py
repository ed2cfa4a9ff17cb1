"""The nodes as a gateway sees them: where it places new sessions and finds existing ones.

:class:`RemoteNodes` is the gateway's :class:`~kernel_pool.port.SessionHost` when sessions
run on ``replgate node`` processes. It keeps no state a restart would lose: which node runs a
session is in the shared database (the :class:`~node.registry.Registry`), and each session's
state is its node's. It keeps what is cheap to rebuild: one connection pool per node, and the
sessions it attached, until they are closed.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, ClassVar

from kernel_pool import (
    ClosedListener,
    KernelPoolError,
    NodeRecord,
    NodeUnreachable,
    NoNodeAvailable,
    PoolSettings,
    Profile,
    ProfileNotFound,
    SessionNotFound,
    SessionPort,
    SessionState,
    SnapshotSaved,
    UnknownNode,
)
from kernel_pool.bundles import BundleStore
from node import recovery
from node.client import NodeClient
from node.records import SessionRecords
from node.registry import Registry
from node.remote import RemoteSession
from node.restore import NotRestored, RestoreSession, restore_on
from node.secret_answers import SecretAnswers
from node.snapshots import FromSnapshot, SaveSnapshot, delete_on, make_on, save_on
from node.templates import TemplateProfiles
from node.wire import CreateSession, ForkSession

logger = logging.getLogger(__name__)


class RemoteNodes:
    """Sessions placed on, and reached at, the nodes the registry knows."""

    first_epoch: ClassVar[int] = 1
    """A session placed on a node starts at epoch 1, its first placement (each later one
    raises it, and fences an older owner off)."""

    def __init__(self, settings: PoolSettings, registry: Registry,
                 tls: ssl.SSLContext | None, records: SessionRecords, *,
                 bundles: bool = False, images: BundleStore | None = None) -> None:
        self.settings = settings
        self.registry = registry
        self.records = records
        """Where each session runs, as the shared database says (kept while it tells of
        changes: :mod:`node.records`)."""
        self.bundles = bundles
        """Whether the nodes keep paused sessions in a bundle store: then a session moves
        off a drained node, and one of a lost node resumes elsewhere from its last pause."""
        self.templates = TemplateProfiles(images)  # (``images``: where their images are)
        self._pausing: set[asyncio.Task[None]] = set()
        """Drains pausing their node's sessions."""
        self._tls = tls
        self._clients: dict[str, NodeClient] = {}
        self._sessions: dict[str, RemoteSession] = {}
        self._attaching: dict[str, asyncio.Future[RemoteSession]] = {}
        self._down: set[str] = set()
        """The nodes declared down, as of the last look (:meth:`watch`)."""
        self._serving = 0
        """The nodes ``up`` at the last look (:meth:`watch`), for the health figures."""
        self._draining: set[str] = set()
        """The nodes drained, as of the last look or this gateway's own drain."""
        records.on_node_state = self._node_state
        self.secret_answers = SecretAnswers(records.store, None)  # (source: the gateway's)
        self.on_session_closed: list[ClosedListener] = []
        self.on_session_paused: list[Callable[[SessionPort], None]] = []
        self.on_session_resumed: list[Callable[[SessionPort], None]] = []

    def __repr__(self) -> str:
        return f"<RemoteNodes {len(self._clients)} reached, {len(self._sessions)} sessions>"

    def stats(self) -> dict[str, int]:
        """What this gateway holds: kernels are the nodes' (``GET /v1/nodes``)."""
        return {"idle": 0, "starting": 0, "in_use": 0, "sessions": len(self._sessions),
                "paused": sum(s.paused for s in self._sessions.values()), "max": 0,
                "nodes": self._serving}

    def profile(self, name: str) -> Profile:
        try:
            return self.settings.profiles[name]
        except KeyError:
            raise ProfileNotFound(name, sorted(self.settings.profiles)) from None

    @property
    def adds_profiles(self) -> bool:
        """With a bundle store only: custom templates' images reach the nodes through it."""
        return self.templates.store is not None

    def set_profile(self, profile: Profile) -> None:
        self.templates.add(self.settings.profiles, profile)

    def remove_profile(self, name: str) -> None:
        self.templates.remove(self.settings.profiles, name)

    async def client(self, node_id: str) -> NodeClient:
        """The connection to a node, made on first use from its registered address."""
        client = self._clients.get(node_id)
        if client is None:
            record = await self.registry.get(node_id)
            if record is None:
                raise NodeUnreachable("-", f"node {node_id} is not registered")
            client = self._client_for(record)
        return client

    def _client_for(self, record: NodeRecord) -> NodeClient:
        client = self._clients.get(record.id)
        if client is None or client.address != record.address:
            client = NodeClient(record.id, record.address, self._tls, secrets=self.secret_answers)
            self._clients[record.id] = client
        return client

    # -- sessions ------------------------------------------------------------------------------

    async def create_session(self, profile: str = "default", *,
                             env: dict[str, str] | None = None,
                             metadata: dict[str, Any] | None = None,
                             session_id: str | None = None, tenant: str = "",
                             lost: str | None = None, exclude: Collection[str] = (),
                             admitted: Awaitable[None] | None = None) -> RemoteSession:
        """A session on the node with the most room (its slot claimed in the database first:
        two gateways placing at once never fill a node past its capacity). ``lost``: see
        :meth:`KernelPool.create_session`; ``exclude``: nodes not to place it on;
        ``admitted``: awaited once the slot is claimed, before the node is asked (the caller's
        own check, run beside the claim): what it raises gives the slot back and is raised."""
        self.profile(profile)
        node = await self.registry.place(exclude=exclude)
        try:
            if admitted is not None:
                await admitted
            state = await self._client_for(node).create(CreateSession(
                profile=profile, env=env or {}, metadata=metadata or {}, session_id=session_id,
                lost=lost, template=self.templates.sent_with(profile)))
        except BaseException:
            await self.registry.release(node.id)
            raise
        session = self._session(self._client_for(node), state, tenant)
        self._sessions[session.id] = session
        return session

    def _session(self, client: NodeClient, state: SessionState, tenant: str) -> RemoteSession:
        return RemoteSession(client, state, tenant=tenant,
                             max_queued=self.settings.max_queued_executions)

    async def restore_session(self, request: RestoreSession, *,
                              exclude: Collection[str] = ()) -> RemoteSession:
        """The session made again, paused, from its bundle (its last pause, kept in the
        bundle store) on the node with the most room, its slot claimed first.
        :class:`~node.restore.NotRestored` when there is nothing to make it from (no bundle,
        no bundle store on that node, or a bundle refused)."""
        node = await self.registry.place(exclude=exclude)
        try:
            client = self._client_for(node)
            restored = await restore_on(client, request)
        except BaseException:
            await self.registry.release(node.id)
            raise
        if restored.state is None:
            await self.registry.release(node.id)
            why = restored.refused or restored.missing or "nothing to restore it from"
            logger.info("session %s not restored on node %s: %s", request.session_id, node.id,
                        why)
            raise NotRestored(why, refused=restored.refused is not None)
        session = self._session(client, restored.state, request.tenant)
        self._sessions[session.id] = session
        return session

    async def attach(self, session_id: str, node_id: str) -> RemoteSession:
        """The session another gateway (or this one, before a restart) placed on ``node_id``.

        One request to its node per session and gateway: concurrent first requests share it.
        """
        session = self._sessions.get(session_id)
        if session is not None and session.node == node_id and not session.closed:
            return session
        attaching = self._attaching.get(session_id)
        if attaching is None:
            attaching = asyncio.ensure_future(self._attach(session_id, node_id))
            self._attaching[session_id] = attaching
            attaching.add_done_callback(lambda _: self._attaching.pop(session_id, None))
        return await asyncio.shield(attaching)

    async def _attach(self, session_id: str, node_id: str) -> RemoteSession:
        client = await self.client(node_id)
        session = self._session(client, await client.state(session_id), "")
        self._sessions[session_id] = session
        return session

    async def fork_session(self, parent_id: str, count: int = 1,
                           metadata: dict[str, Any] | None = None) -> list[RemoteSession]:
        """Copies on the parent's node (they share its snapshot there)."""
        parent = self.get_session(parent_id)
        states = await parent.client.fork(parent_id, ForkSession(count=count,
                                                                 metadata=metadata or {}))
        children = [self._session(parent.client, state, parent.tenant) for state in states]
        for child in children:
            self._sessions[child.id] = child
        return children

    # -- saved snapshots: written and read by the nodes, in the shared bundle store ----------

    async def snapshot_session(self, session_id: str, snapshot_id: str, *, tenant: str,
                               memory: bool = True) -> SnapshotSaved:
        """Saved by the session's node (see :meth:`KernelPool.snapshot_session`)."""
        session = await self.find(session_id, tenant=tenant)
        return await save_on(session.client, session_id, SaveSnapshot(
            snapshot_id=snapshot_id, tenant=tenant, memory=memory))

    async def create_from_snapshot(self, snapshot_id: str, *, tenant: str, profile: str,
                                   env: dict[str, str] | None = None,
                                   metadata: dict[str, Any] | None = None,
                                   admitted: Awaitable[None] | None = None) -> RemoteSession:
        """A copy of the snapshot on the node with the most room, its slot claimed first
        (as :meth:`create_session` places one)."""
        self.profile(profile)
        node = await self.registry.place()
        try:
            if admitted is not None:
                await admitted
            client = self._client_for(node)
            state = await make_on(client, snapshot_id, FromSnapshot(
                tenant=tenant, profile=profile, env=env or {}, metadata=metadata or {}))
        except BaseException:
            await self.registry.release(node.id)
            raise
        session = self._session(client, state, tenant)
        self._sessions[session.id] = session
        return session

    async def delete_snapshot(self, tenant: str, snapshot_id: str) -> None:
        """Removed by a node that is up (they share the bundle store)."""
        nodes = await self.registry.nodes()
        up = [n for n in nodes if n.state != "down"]
        if not up:
            raise NoNodeAvailable(nodes)
        await delete_on(self._client_for(up[0]), tenant, snapshot_id)

    async def find(self, session_id: str, *, tenant: str | None = None) -> RemoteSession:
        """The live session (of ``tenant``, when given), wherever it runs: placed again when
        its node lost it, moved when its node is drained (:mod:`node.recovery`)."""
        return await recovery.find(self, session_id, tenant)

    async def tenant_of(self, session_id: str) -> str | None:
        """The tenant of a live session, as the shared database says; None when there is
        none."""
        record = await self.records.store.get_session(session_id)
        return None if record is None or record.deleted else record.tenant

    async def list_sessions(self, tenant: str | None = None) -> list[SessionPort]:
        """The live sessions (of ``tenant``, when given), wherever they run; one whose node
        is out of reach is listed once it is back."""
        found: list[SessionPort] = []
        for record in await self.records.store.list_sessions(tenant=tenant):
            try:
                found.append(await self.find(record.id, tenant=record.tenant))
            except KernelPoolError as exc:
                logger.warning("session %s not listed: %s", record.id, exc)
        return found

    async def count_sessions(self, tenant: str | None = None) -> int:
        """How many live sessions (of ``tenant``, when given) the shared database holds."""
        if tenant is None:
            return len(await self.records.store.list_sessions())
        return await self.records.store.count_sessions(tenant)

    async def record_lifecycle(self, session: RemoteSession) -> None:
        """The shared database learns the session's status and sandbox (a move or a drain
        made them)."""
        await self.records.store.update_session(
            session.id, status=session.status.value,
            sandbox=session.sandbox_info().model_dump(mode="json"))

    async def languages(self, profile: str) -> tuple[str, ...] | None:
        """Unknown: the nodes' image tells only once a session runs there."""
        self.profile(profile)
        return None

    # -- nodes ---------------------------------------------------------------------------------

    async def nodes(self) -> list[NodeRecord]:
        """Every node of the shared database."""
        return await self.registry.nodes()

    async def drain(self, node_id: str, draining: bool) -> NodeRecord:
        """Take a node out of service (no new sessions; its sessions paused, in the
        background) or back in."""
        if await self.registry.get(node_id) is None:
            raise UnknownNode(node_id)
        self.note_draining(node_id, draining)
        if not draining:
            return await self.registry.undrain(node_id)
        record = await self.registry.drain(node_id)
        task = asyncio.get_running_loop().create_task(recovery.pause_all(self, node_id))
        self._pausing.add(task)
        task.add_done_callback(self._pausing.discard)
        return record

    def is_down(self, node_id: str) -> bool:
        """Whether the node was declared down (its sessions are to be placed again)."""
        return node_id in self._down

    async def is_draining(self, node_id: str) -> bool:
        """Whether the node is drained (its paused sessions are to move to other nodes): read
        again from the registry when the last look said so (an undrain may be newer)."""
        if node_id not in self._draining:
            return False
        record = await self.registry.get(node_id)
        if record is None or record.state != "draining":
            self._draining.discard(node_id)
            return False
        return True

    def _node_state(self, node_id: str, state: str) -> None:
        """A node's state as another gateway (or a node) just changed it: requests stop going
        to a lost node at once, not at this gateway's next look."""
        (self._down.add if state == "down" else self._down.discard)(node_id)
        (self._draining.add if state == "draining" else self._draining.discard)(node_id)

    def note_draining(self, node_id: str, draining: bool) -> None:
        """This gateway drained or undrained the node (the others see it at their next look)."""
        if draining:
            self._draining.add(node_id)
        else:
            self._draining.discard(node_id)

    async def delete_session(self, session_id: str) -> None:
        """Delete the session on its node; a node that is down removes it as it comes back
        (it is fenced then), so the session ends here at once. A node up but not answering
        is an error, and nothing changes."""
        session = self.get_session(session_id)
        if self.is_down(session.node):
            session.abandon()
        else:
            await session.close()
        # (Its slot is given back by its node, which does so for every session it ends.)
        self._sessions.pop(session_id, None)
        for listener in self.on_session_closed:
            try:
                listener(session, "deleted")
            except Exception:
                logger.exception("on_session_closed listener failed")

    def forget(self, session_id: str) -> None:
        """Drop a session this gateway attached: it was deleted (through another gateway, or
        ended by its node)."""
        self._sessions.pop(session_id, None)

    async def discard(self, session: RemoteSession) -> None:
        """Remove a copy that lost the race to be placed (the session lives on elsewhere)."""
        if self._sessions.get(session.id) is session:
            del self._sessions[session.id]
        await session.close()

    def get_session(self, session_id: str) -> RemoteSession:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise SessionNotFound(session_id) from None

    @property
    def sessions(self) -> Mapping[str, RemoteSession]:
        return dict(self._sessions)

    async def watch(self, every_s: float) -> None:
        """Declare down the nodes whose heartbeat is late, until cancelled (every gateway
        does; the database lets one win per node)."""
        while True:
            try:
                for node_id in await self.registry.mark_lost():
                    logger.warning("node %s is down: its heartbeat is late; its sessions will "
                                   "be placed again when next used", node_id)
                nodes = await self.registry.nodes()
                self._down = {n.id for n in nodes if n.state == "down"}
                self._draining = {n.id for n in nodes if n.state == "draining"}
                self._serving = sum(n.state == "up" for n in nodes)
                self.secret_answers.keep_open(self._client_for(n) for n in nodes if n.state == "up")
            except Exception as exc:  # the database away for a moment: look again later
                logger.warning("could not look for lost nodes: %s", exc)
            await asyncio.sleep(every_s)

    async def close(self) -> None:
        """Close the connections; the sessions run on, on their nodes."""
        for client in list(self._clients.values()):
            await client.close()
        self._clients.clear()
