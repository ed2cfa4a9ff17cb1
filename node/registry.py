"""The nodes in the shared database: registration, heartbeats, placement and fencing.

Every gateway and every node holds a :class:`Registry` over the one database they share; none
keeps a list of nodes of its own. What two of them could race on is decided by the database,
in one statement each:

- **A slot** (:meth:`Registry.place`): the ``up`` node with a fresh heartbeat and the most room
  gets ``sessions + 1`` by a conditional UPDATE that re-checks ``sessions < max_kernels`` on the
  row it changes, so concurrent placements never fill a node past its capacity. On PostgreSQL
  the row is chosen ``FOR UPDATE SKIP LOCKED`` (concurrent claims spread over the nodes rather
  than queue behind one row); a claim that found every candidate locked waits for one of them,
  drawn at random.
  On SQLite the statement holds the file's write lock.
- **A lost node** (:meth:`Registry.mark_lost`): ``up``/``draining`` to ``down`` when its
  heartbeat is older than the timeout; the UPDATE re-checks the state, so one caller wins per
  node however many gateways look.
- **An owner** (:meth:`Registry.assign`, :meth:`Registry.move`): each placement of a session
  raises its ``epoch``; a node acting with an older one is :class:`Fenced`.

Times are the database's clock (ISO 8601 UTC text), never a gateway's or a node's, so machines
whose clocks disagree still agree on which heartbeat is late.

A node's ``sessions`` counts its claimed slots. Its heartbeat reports what it runs, which leaves
out a session still being made after its claim: the heartbeat takes the node's figure only
once no claim is more recent than the timeout (until then the larger of the two), so a claim
in flight is never undone, and a slot a killed gateway claimed and never used is given back.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import RowMapping, String, TextClause, bindparam, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from common.database import Database
from kernel_pool import NodeRecord, NoNodeAvailable, UnknownNode
from kernel_pool.state import NodeState

__all__ = ["NODES_CHANNEL", "Fenced", "NodeIdTaken", "Registry"]

_COLUMNS = "id, address, state, kernels, max_kernels, sessions, heartbeat_at"
DEADLOCK = "40P01"
DEADLOCK_ATTEMPTS = 5
"""Tries of a statement PostgreSQL ends as a deadlock (each is committed alone, so it is
simply sent again). A slot's claim that waits (``FOR UPDATE`` on a row
drawn at random) and finds its row changed moves on to another and keeps the first locked: in
a burst of a hundred creates two such claims took each other's rows in turn (one of them
answered 503)."""
NODES_CHANNEL = "replgate_nodes"
"""PostgreSQL's channel on which a change of a node's state is told (``"ID STATE"``), so that
every gateway stops sending a lost node requests as soon as one declared it down."""


class Fenced(Exception):
    """A node acted as its own self after it was declared down (its sessions are placed
    elsewhere since: it must drop them all)."""

    def __init__(self, node_id: str, reason: str) -> None:
        self.node_id = node_id
        super().__init__(reason)


class NodeIdTaken(ValueError):
    """A node registering under the id of a live node at another address."""

    def __init__(self, node_id: str, holder: NodeRecord) -> None:
        self.node_id = node_id
        self.holder = holder
        super().__init__(
            f"node id {node_id!r} is held by a live node at {holder.address} (its state "
            f"{holder.state}, last heartbeat at {holder.heartbeat_at}): start this node with "
            "another --id (or, with no --id, another state folder: the default id is kept "
            "in it, and a copied folder copies it), or stop that node first")


class Registry:
    """The nodes and the placement of sessions, in ``database`` (shared by every gateway and
    node). ``heartbeat_timeout_s``: a node silent for longer is no longer placed on, and
    :meth:`mark_lost` declares it down."""

    def __init__(self, database: Database, *, heartbeat_timeout_s: float = 10.0) -> None:
        if heartbeat_timeout_s <= 0:
            raise ValueError("heartbeat_timeout_s must be positive")
        self.database = database
        self.heartbeat_timeout_s = heartbeat_timeout_s
        postgres = database.dialect == "postgresql"
        now, cutoff = (_postgres_times() if postgres else _sqlite_times())
        greatest = "GREATEST" if postgres else "MAX"
        candidates = ("FROM nodes WHERE state = 'up' AND sessions < max_kernels "
                      f"AND heartbeat_at >= {cutoff} AND id NOT IN :exclude")
        exclude = bindparam("exclude", expanding=True, type_=String)

        def claim(order: str, lock: str) -> TextClause:
            return text(
                f"UPDATE nodes SET sessions = sessions + 1, claimed_at = {now} "
                f"WHERE id = (SELECT id {candidates} ORDER BY {order} LIMIT 1 {lock}) "
                f"AND state = 'up' AND sessions < max_kernels RETURNING {_COLUMNS}"
            ).bindparams(exclude)

        self._locking = postgres
        self._claim_first = claim("max_kernels - sessions DESC, id",
                                  "FOR UPDATE SKIP LOCKED" if postgres else "")
        # Claims that found every candidate locked wait each on one drawn at random: on the
        # best one, they would all queue behind a single row while the others stand idle.
        self._claim_waiting = claim("random()", "FOR UPDATE")
        self._any_room = text(f"SELECT count(*) {candidates}").bindparams(exclude)
        self._register = text(
            "INSERT INTO nodes (id, address, state, kernels, max_kernels, sessions, "
            f"heartbeat_at, claimed_at) VALUES (:id, :address, 'up', 0, :max_kernels, 0, {now}, "
            "NULL) ON CONFLICT (id) DO UPDATE SET address = excluded.address, "
            # An operator's drain outlives a restart of the node; nothing else of it does.
            "state = CASE WHEN nodes.state = 'draining' THEN 'draining' ELSE 'up' END, "
            "kernels = 0, max_kernels = excluded.max_kernels, sessions = 0, "
            f"heartbeat_at = excluded.heartbeat_at, claimed_at = NULL "
            # Another live node's id is not taken over: the same address is this node's own
            # earlier life (it has the port now), a late or down row is free to take.
            f"WHERE nodes.address = excluded.address OR nodes.state = 'down' "
            f"OR nodes.heartbeat_at < {cutoff} RETURNING {_COLUMNS}")
        self._holder = text(
            f"SELECT {_COLUMNS} FROM nodes WHERE id = :id AND address <> :address "
            f"AND state <> 'down' AND heartbeat_at >= {cutoff}")
        self._heartbeat = text(
            f"UPDATE nodes SET kernels = :kernels, heartbeat_at = {now}, "
            f"sessions = CASE WHEN claimed_at IS NULL OR claimed_at < {cutoff} THEN :sessions "
            f"ELSE {greatest}(sessions, :sessions) END "
            f"WHERE id = :id AND state <> 'down' AND address = :address RETURNING {_COLUMNS}")
        self._mark_lost = text(
            f"UPDATE nodes SET state = 'down' WHERE state <> 'down' AND heartbeat_at < {cutoff} "
            "RETURNING id")

    def __repr__(self) -> str:
        return f"<Registry {self.database!r} timeout={self.heartbeat_timeout_s:g}s>"

    # -- nodes ----------------------------------------------------------------------------

    async def register(self, node_id: str, address: str, max_kernels: int) -> NodeRecord:
        """A node starting (or starting afresh after it was :class:`Fenced`): ``up`` (still
        ``draining`` if an operator drained it), at ``address``, with no session. A node that
        was ``down`` owns none of its sessions again: each has been or will be placed anew
        (a higher epoch), and the node dropped them before registering."""
        if max_kernels < 0:
            raise ValueError("max_kernels must be at least 0")
        row = await self._one(self._register, id=node_id, address=address,
                              max_kernels=max_kernels, cutoff=self._cutoff)
        if row is None:
            holder = await self.get(node_id)
            if holder is None:  # it went down and was removed meanwhile: take the id now
                return await self.register(node_id, address, max_kernels)
            raise NodeIdTaken(node_id, holder)
        node = NodeRecord.model_validate(dict(row))
        await self._tell([(node.id, node.state)])
        return node

    async def check_free(self, node_id: str, address: str) -> None:
        """Raise :class:`NodeIdTaken` if a live node at another address holds ``node_id``:
        asked before a node starts anything (:meth:`register` refuses it too, atomically)."""
        row = await self._one(self._holder, id=node_id, address=address, cutoff=self._cutoff)
        if row is not None:
            raise NodeIdTaken(node_id, NodeRecord.model_validate(dict(row)))

    async def heartbeat(self, node_id: str, address: str, *, kernels: int,
                        sessions: int) -> NodeRecord:
        """The node at ``address`` is alive, runs ``kernels`` kernels and ``sessions`` sessions.

        Raises:
            Fenced: the node was declared down (or never registered, or its id was taken by a
                node at another address once this one was late): its sessions are, or will
                be, placed elsewhere. It must drop every one of them, then :meth:`register`.
        """
        row = await self._one(self._heartbeat, id=node_id, kernels=kernels, sessions=sessions,
                              address=address, cutoff=self._cutoff)
        if row is None:
            known = await self.get(node_id)
            if known is None:
                raise Fenced(node_id, f"node {node_id} is not registered")
            if known.address != address:
                raise Fenced(node_id, f"node id {node_id} was taken by a node at "
                             f"{known.address} while this one was late: its sessions are "
                             "placed there")
            raise Fenced(node_id, f"node {node_id} was declared down (its heartbeat was late): "
                         "its sessions are placed elsewhere")
        return NodeRecord.model_validate(dict(row))

    async def nodes(self) -> list[NodeRecord]:
        """Every node, by id."""
        async with self.database.connect() as connection:
            result = await connection.execute(text(f"SELECT {_COLUMNS} FROM nodes ORDER BY id"))
            return [NodeRecord.model_validate(dict(row)) for row in result.mappings()]

    async def get(self, node_id: str) -> NodeRecord | None:
        """The node with that id, or None."""
        row = await self._one(text(f"SELECT {_COLUMNS} FROM nodes WHERE id = :id"), id=node_id)
        return None if row is None else NodeRecord.model_validate(dict(row))

    async def drain(self, node_id: str) -> NodeRecord:
        """No new session on the node (its sessions stay until moved). A ``down`` node stays
        down. Raises :class:`UnknownNode`."""
        return await self._set_state(node_id, "draining", "up")

    async def undrain(self, node_id: str) -> NodeRecord:
        """The node takes new sessions again. A ``down`` node stays down (it comes back by
        registering). Raises :class:`UnknownNode`."""
        return await self._set_state(node_id, "up", "draining")

    async def mark_lost(self) -> list[str]:
        """Declare ``down`` the nodes whose heartbeat is older than the timeout; their ids.
        Each node is returned to one caller only, however many gateways call at once."""
        async with self.database.connect() as connection:
            result = await connection.execute(self._mark_lost, {"cutoff": self._cutoff})
            lost = sorted(row[0] for row in result)
        await self._tell([(node_id, "down") for node_id in lost])
        return lost

    # -- placement ------------------------------------------------------------------------

    async def place(self, *, exclude: Collection[str] = ()) -> NodeRecord:
        """Claim a slot on the ``up`` node with a fresh heartbeat and the most room
        (``max_kernels - sessions``), not one of ``exclude``; the node, its count raised.
        Give the slot back with :meth:`release` if the session is not made after all.

        Raises:
            NoNodeAvailable: every node is full, draining, down, silent or excluded.
        """
        params = {"cutoff": self._cutoff, "exclude": list(exclude)}
        async with self.database.connect() as connection:
            row = await self._first(connection, self._claim_first, params)
            # Nothing claimed on PostgreSQL: no room anywhere, or every candidate's row was
            # being claimed by someone else at that instant. Then wait for one; a row that
            # filled up meanwhile is refused by the UPDATE, and we look again.
            while row is None and self._locking:
                row = await self._first(connection, self._claim_waiting, params)
                if row is None and not (
                        await connection.execute(self._any_room, params)).scalar():
                    break
        if row is None:
            raise NoNodeAvailable(await self.nodes(), exclude)
        return NodeRecord.model_validate(dict(row))

    async def release(self, node_id: str) -> None:
        """Give a slot back: a session of the node ended, moved, or was never made."""
        async with self.database.connect() as connection:
            await connection.execute(text(
                "UPDATE nodes SET sessions = sessions - 1 WHERE id = :id AND sessions > 0"),
                {"id": node_id})

    # -- sessions' owners -----------------------------------------------------------------

    async def move(self, session_id: str, node_id: str, epoch: int) -> int | None:
        """Place a live session on ``node_id`` if its epoch is still ``epoch`` (the placement
        its caller saw): the new epoch, or None when someone placed it first (or it was
        deleted) and that placement stands."""
        row = await self._one(text(
            "UPDATE sessions SET node = :node, epoch = epoch + 1 "
            "WHERE id = :id AND epoch = :epoch AND deleted = 0 RETURNING epoch"),
            id=session_id, node=node_id, epoch=epoch)
        return None if row is None else int(row["epoch"])

    async def sessions_of(self, node_id: str) -> list[str]:
        """The ids of the live sessions placed on the node, oldest first."""
        async with self.database.connect() as connection:
            result = await connection.execute(text(
                "SELECT id FROM sessions WHERE node = :node AND deleted = 0 "
                "ORDER BY created_at, id"), {"node": node_id})
            return [row[0] for row in result]

    # -- helpers --------------------------------------------------------------------------

    @property
    def _cutoff(self) -> Any:
        """The ``:cutoff`` parameter: the timeout, as each dialect's time arithmetic takes it."""
        if self.database.dialect == "postgresql":
            return self.heartbeat_timeout_s
        return f"-{self.heartbeat_timeout_s:.6f} seconds"

    async def _set_state(self, node_id: str, state: NodeState, current: NodeState) -> NodeRecord:
        row = await self._one(text(
            f"UPDATE nodes SET state = CASE WHEN state = :current THEN :state ELSE state END "
            f"WHERE id = :id RETURNING {_COLUMNS}"), id=node_id, state=state, current=current)
        if row is None:
            raise UnknownNode(node_id)
        node = NodeRecord.model_validate(dict(row))
        await self._tell([(node.id, node.state)])
        return node

    async def _tell(self, changes: list[tuple[str, str]]) -> None:
        """Tell every gateway listening on :data:`NODES_CHANNEL` of these states (PostgreSQL
        only: with SQLite there is one gateway, which looks itself)."""
        if not changes or self.database.dialect != "postgresql":
            return
        async with self.database.connect() as connection:
            for node_id, state in changes:
                await connection.execute(text("SELECT pg_notify(:channel, :payload)"),
                                         {"channel": NODES_CHANNEL,
                                          "payload": f"{node_id} {state}"})

    async def _one(self, statement: TextClause, **params: Any) -> RowMapping | None:
        async with self.database.connect() as connection:
            return await self._first(connection, statement, params)

    @staticmethod
    async def _first(connection: AsyncConnection, statement: TextClause,
                     params: dict[str, Any]) -> RowMapping | None:
        attempt = 1
        while True:
            try:
                result = await connection.execute(statement, params)
            except DBAPIError as exc:
                if getattr(exc.orig, "sqlstate", None) != DEADLOCK or attempt == DEADLOCK_ATTEMPTS:
                    raise
                attempt += 1  # the other claim went through: this statement alone was undone
                continue
            return result.mappings().first()


def _postgres_times() -> tuple[str, str]:
    """Now, and now less ``:cutoff`` seconds, as ISO 8601 UTC text of the server's clock."""
    iso = "'YYYY-MM-DD\"T\"HH24:MI:SS.US\"+00:00\"'"
    return (f"to_char(now() AT TIME ZONE 'UTC', {iso})",
            f"to_char((now() - make_interval(secs => :cutoff)) AT TIME ZONE 'UTC', {iso})")


def _sqlite_times() -> tuple[str, str]:
    """The same in SQLite's terms (``:cutoff`` a modifier: ``'-10.000000 seconds'``);
    milliseconds, padded to the same width so that the texts compare as the times do."""
    iso = "'%Y-%m-%dT%H:%M:%f000+00:00'"
    return f"strftime({iso}, 'now')", f"strftime({iso}, 'now', :cutoff)"
