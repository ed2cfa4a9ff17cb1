"""Sessions' records as a gateway of many machines reads them: kept while PostgreSQL tells of
every change to a session's placement, read again otherwise.

Every request names a session, and the gateway must know whether it still exists and where it
runs (another gateway may have deleted it, or placed it on another node). Reading its row
costs about 0.7 ms; a gateway listening on ``replgate_sessions`` (the notices migration 0005's
trigger sends as a session's node, epoch or deletion changes) keeps what it read until the
session's notice comes. While it does not listen (starting, or its connection broke), nothing
is kept and every lookup reads. A read that began before a notice is not kept: the notice may
be about what it read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg

from common.store import SessionRecord, Store
from node.registry import NODES_CHANNEL

logger = logging.getLogger(__name__)

CHANNEL = "replgate_sessions"
LISTEN_AGAIN_S = 1.0
"""The wait before listening again after the connection broke."""


class SessionRecords:
    """Lookups of sessions' records (see the module's docstring)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._kept: dict[str, SessionRecord] = {}
        self._listening = False
        self._notices = 0
        """Raised by every notice: a read begun before one is not kept."""
        self.on_node_state: Callable[[str, str], None] | None = None
        """Called with a node's id and state as a notice on :data:`NODES_CHANNEL` tells of a
        change (the same connection listens to both)."""

    @property
    def listening(self) -> bool:
        """Whether notices come (records are kept only then)."""
        return self._listening

    async def get(self, session_id: str) -> SessionRecord | None:
        """The session's record, as of the last notice about it."""
        kept = self._kept.get(session_id)
        if kept is not None:
            return kept
        listening, notices = self._listening, self._notices
        record = await self.store.get_session(session_id)
        if (record is not None and listening and self._listening
                and notices == self._notices):
            self._kept[session_id] = record
        return record

    def forget(self, session_id: str) -> None:
        """Read the session's record again next time (this gateway changed it)."""
        self._notices += 1
        self._kept.pop(session_id, None)

    async def listen(self) -> None:
        """Listen for notices until cancelled, connecting again when the connection breaks."""
        database = self.store.database
        if database.dialect != "postgresql":
            return
        url = database.url.set(drivername="postgresql").render_as_string(hide_password=False)
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    await conn.execute(f"LISTEN {NODES_CHANNEL}")
                    self._listening = True
                    async for notice in conn.notifies():
                        if notice.channel == NODES_CHANNEL:
                            node_id, _, state = notice.payload.rpartition(" ")
                            if self.on_node_state is not None:
                                self.on_node_state(node_id, state)
                        else:
                            self.forget(notice.payload)
            except psycopg.Error as exc:
                logger.warning("notices of sessions' placements stopped (%s): every request "
                               "reads its session's record until they come again", exc)
            finally:
                self._listening = False
                self._notices += 1
                self._kept.clear()
            await asyncio.sleep(LISTEN_AGAIN_S)
