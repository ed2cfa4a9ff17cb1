"""The gateway's side of brokered secrets on nodes: a node's :class:`~node.wire.SecretAsk`,
answered on the channel the gateway keeps open to it (docs/secrets.md).

A secret goes to a node only for a session the shared database says that node runs, and only
if that session's network policy has a rule naming the secret: a node cannot get another
node's sessions' secrets, nor a secret its session's rules do not name, whatever it asks. The
value is read at each question (:meth:`gateway.secrets.Secrets.lookup_for`), so a replaced or
deleted secret applies to the node's next request as it does here. Answers name the secret
and the session, never the value, in anything but the answer itself.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from common.store import Store
from node.wire import SecretAnswer, SecretAsk

__all__ = ["SecretAnswers"]

logger = logging.getLogger(__name__)

Source = Callable[[str, str | None], Callable[[str], Awaitable[str | None]]]
"""A session's secrets by (tenant, session id): the gateway's ``Secrets.lookup_for``."""


class KeptChannel(Protocol):
    """A node's connection whose channel can be kept open (``NodeClient``, which holds a
    :class:`SecretAnswers`: named here by what it does, not imported)."""

    def keep_channel(self) -> None: ...


class SecretAnswers:
    """Answers the nodes' questions from the shared database and the gateway's secrets."""

    def __init__(self, store: Store, source: Source | None) -> None:
        self.store = store
        self.source = source
        """The gateway's secrets (None: it has no ``REPLGATE_SECRETS_KEY``)."""

    def __repr__(self) -> str:
        return f"<SecretAnswers {'enabled' if self.source else 'disabled'}>"

    def keep_open(self, clients: Iterable[KeptChannel]) -> None:
        """With secrets, keep a channel open to each of these nodes (those up): a node then
        always has a gateway to ask, even while no execution runs on it."""
        if self.source is not None:
            for client in clients:
                client.keep_channel()

    async def answer(self, node_id: str, ask: SecretAsk) -> SecretAnswer:
        """The value of ``ask.name`` for ``ask.session_id`` if ``node_id`` runs that session
        and its rules name the secret; else why not."""
        try:
            value = await self._value(node_id, ask)
        except _Refused as refused:
            logger.warning("node %s asked for secret %s of session %s: refused: %s", node_id,
                           ask.name, ask.session_id, refused)
            return SecretAnswer(ask=ask.ask, refused=str(refused))
        except Exception as exc:  # the database away: the node's request is refused, not sent
            logger.error("node %s asked for secret %s of session %s: %s", node_id, ask.name,
                         ask.session_id, exc)
            why = f"the gateway could not read it ({exc!r})"
            return SecretAnswer(ask=ask.ask, refused=why[:300])
        return SecretAnswer(ask=ask.ask, value=value)

    async def _value(self, node_id: str, ask: SecretAsk) -> str | None:
        if self.source is None:
            raise _Refused("secrets are not enabled on the gateway (REPLGATE_SECRETS_KEY)")
        record = await self.store.get_session(ask.session_id)
        if record is None or record.deleted or record.node != node_id:
            raise _Refused(f"session {ask.session_id} does not run on node {node_id}")
        rules = record.network.rules if record.network is not None else []
        if not any(ask.name in rule.named() for rule in rules):
            raise _Refused(f"no rule of session {ask.session_id} names the secret "
                           f"{ask.name!r}")
        return await self.source(record.tenant, record.id)(ask.name)


class _Refused(Exception):
    """A question the gateway does not answer with a value (its sentence is the answer)."""
