"""The node's side of brokered secrets: a value asked of a gateway, over its channel, for one
request of one session (docs/secrets.md).

A node holds no secret: its sessions' egress brokers (:mod:`kernel_pool._broker`) ask
:class:`SecretAsks` at each request that needs one, and it asks a gateway on a channel that
gateway keeps open to this node (:mod:`node.channel_server`; every gateway keeps one to each
node that is up). The gateway answers only for a session placed on this node whose rules name
the secret (:mod:`node.secret_answers`). The value lives in this process's memory for that
request and is written nowhere: not in the state directory, a bundle, a log line or a span.
With no gateway connected, or none answering in time, the request is refused (503), never
sent with an old value: a replaced or deleted secret applies here as at once as on a gateway.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable

from node.wire import ChannelFrame, SecretAnswer, SecretAsk

__all__ = ["ASK_TIMEOUT_S", "SecretAsks", "SecretUnavailable"]

logger = logging.getLogger(__name__)

ASK_TIMEOUT_S = 10.0
"""How long a request waits for a gateway's answer (and, with none connected, for one to
connect: a gateway restarting connects again within half of ``REPLGATE_NODE_TIMEOUT_S``)."""

Send = Callable[[str], None]
"""Puts a message on one gateway's channel."""


class SecretUnavailable(Exception):
    """No gateway gave the secret's value (none connected, none answered, or one refused):
    the request that needed it is not sent."""


class SecretAsks:
    """Questions in flight to the gateways connected to this node, and their answers."""

    def __init__(self, timeout_s: float = ASK_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._channels: list[Send] = []
        """Gateways' channels open now, the latest last (asked first)."""
        self._connected = asyncio.Event()
        self._numbers = itertools.count(1)
        self._waiting: dict[int, tuple[Send, asyncio.Future[SecretAnswer]]] = {}

    def __repr__(self) -> str:
        return f"<SecretAsks {len(self._channels)} gateways, {len(self._waiting)} in flight>"

    def opened(self, send: Send) -> None:
        """A gateway's channel is open: questions may go there."""
        self._channels.append(send)
        self._connected.set()

    def closed(self, send: Send) -> None:
        """A gateway's channel closed: the questions it held are asked elsewhere."""
        if send in self._channels:
            self._channels.remove(send)
        if not self._channels:
            self._connected.clear()
        for number, (sent_on, waiting) in list(self._waiting.items()):
            if sent_on is send and not waiting.done():
                waiting.set_exception(ConnectionError("its gateway's channel closed"))
                self._waiting.pop(number, None)

    def answered(self, answer: SecretAnswer) -> None:
        """A gateway's answer (one not waited for any more is dropped)."""
        waiting = self._waiting.pop(answer.ask, None)
        if waiting is not None and not waiting[1].done():
            waiting[1].set_result(answer)

    def source(self, tenant: str,
               session_id: str | None) -> Callable[[str], Awaitable[str | None]]:
        """The lookup of a session's broker (``KernelPool.secret_source``): each call asks.
        (``tenant`` is not sent: the gateway knows the session's from its own records.)"""

        async def lookup(name: str) -> str | None:
            return await self.ask(session_id, name)

        return lookup

    async def ask(self, session_id: str | None, name: str) -> str | None:
        """The value of secret ``name`` for a request of ``session_id`` (None: it does not
        exist); :class:`SecretUnavailable` when no gateway gives it in time."""
        if session_id is None:
            raise SecretUnavailable("the sandbox has no session")
        last = "no gateway is connected to this node"
        try:
            async with asyncio.timeout(self.timeout_s):
                while True:
                    await self._connected.wait()
                    if not self._channels:  # (closed again before this task ran)
                        continue
                    try:
                        answer = await self._ask_once(self._channels[-1], session_id, name)
                    except ConnectionError as exc:  # asked again on another channel
                        last = str(exc)
                        continue
                    if answer.refused is not None:
                        raise SecretUnavailable(answer.refused)
                    return answer.value
        except TimeoutError:
            raise SecretUnavailable(f"no gateway answered in {self.timeout_s:g} s: "
                                    f"{last}") from None

    async def _ask_once(self, send: Send, session_id: str, name: str) -> SecretAnswer:
        number = next(self._numbers)
        waiting: asyncio.Future[SecretAnswer] = asyncio.get_running_loop().create_future()
        self._waiting[number] = (send, waiting)
        try:
            send(ChannelFrame(stream=0, ask=SecretAsk(ask=number, session_id=session_id,
                                                      name=name)).model_dump_json(
                include={"stream", "ask"}))
            return await waiting
        finally:
            self._waiting.pop(number, None)

