"""The gateway's end of a node's channel: executions over one kept WebSocket (mutual TLS).

Each execution sent to a node, and each session made there, is a
:class:`~node.wire.ChannelRequest` message; its frames come back as
:class:`~node.wire.ChannelFrame` messages tagged with its stream's number, interleaved with
those of the others in flight. One connection per gateway and node, made on
first use and again after it broke; a break ends every stream on it with
:class:`NodeUnreachable`, as a broken HTTP stream did.

The node asks on it too: the secrets its sessions' egress brokers need
(:class:`~node.wire.SecretAsk`), answered by ``answers`` (:mod:`node.secret_answers`). So
that a node always has a gateway to ask, a gateway with secrets keeps the channel open to each
node that is up (:meth:`NodeChannel.keep_open`), not only while executions run.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import websockets
from pydantic import ValidationError
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, WebSocketException

from kernel_pool import NodeUnreachable
from node.wire import (
    ChannelFrame,
    ChannelRequest,
    CreateSession,
    ErrorOut,
    Frame,
    SecretAnswer,
    SecretAsk,
    Submit,
    stream_of,
)

__all__ = ["NodeChannel"]

logger = logging.getLogger(__name__)


Answers = Callable[[SecretAsk], Awaitable[SecretAnswer]]
"""How a gateway answers a node's question for a secret (:mod:`node.secret_answers`)."""


class _Connection:
    """One WebSocket to the node and the streams in flight on it."""

    def __init__(self, ws: ClientConnection, answers: Answers | None = None) -> None:
        self.ws = ws
        self.answers = answers
        self.streams: dict[int, asyncio.Queue[ChannelFrame | None]] = {}
        self._answering: set[asyncio.Task[Any]] = set()
        self.reader = asyncio.create_task(self._read(), name="node-channel-reader")

    @property
    def broken(self) -> bool:
        return self.reader.done()

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                try:
                    message = ChannelFrame.model_validate_json(raw)
                except ValidationError as exc:
                    self._bad_frame(raw, exc)
                    continue
                if message.ask is not None:
                    task = asyncio.create_task(self._answer(message.ask))
                    self._answering.add(task)
                    task.add_done_callback(self._answering.discard)
                    continue
                queue = self.streams.get(message.stream)
                if queue is not None:
                    queue.put_nowait(message)
        except ConnectionClosed:
            pass
        finally:
            for queue in self.streams.values():
                queue.put_nowait(None)
            for task in self._answering:
                task.cancel()

    async def _answer(self, ask: SecretAsk) -> None:
        """A node's question for a secret, answered on the channel (refused by a gateway
        that answers none)."""
        answer = (SecretAnswer(ask=ask.ask, refused="this gateway answers no secrets")
                  if self.answers is None else await self.answers(ask))
        with contextlib.suppress(ConnectionClosed):  # (the node asks again elsewhere)
            await self.ws.send(ChannelRequest(stream=0, answer=answer).model_dump_json(
                include={"stream", "answer"}))

    def _bad_frame(self, raw: str | bytes, exc: ValidationError) -> None:
        """A frame that is not one (a node of another version?) ends its own stream with an
        error that says so; the channel and the other streams on it go on."""
        stream = stream_of(raw)
        errors = exc.errors(include_url=False, include_input=False)
        logger.warning("a bad frame from the node's channel (stream %s): %s", stream, errors)
        queue = None if stream is None else self.streams.get(stream)
        if queue is None:
            return
        error = ErrorOut(error="KernelPoolError",
                         detail=f"the node sent a frame this gateway cannot read: "
                                f"{errors[0]['msg']}")
        queue.put_nowait(ChannelFrame(stream=stream, frame=Frame(error=error), end=True))


class NodeChannel:
    """Executions to one node (see the module's docstring)."""

    def __init__(self, node_id: str, url: str, tls: ssl.SSLContext | None, *,
                 answers: Answers | None = None) -> None:
        self.node_id = node_id
        self._url = url
        self._tls = tls
        self._answers = answers
        self._current: _Connection | None = None
        self._connecting = asyncio.Lock()
        self._numbers = itertools.count(1)

    async def _connection(self, session_id: str) -> _Connection:
        async with self._connecting:
            current = self._current
            if current is None or current.broken:
                try:
                    ws = await websockets.connect(
                        self._url, ssl=self._tls, max_size=None, compression=None,
                        open_timeout=5, close_timeout=1)
                except (OSError, TimeoutError, WebSocketException) as exc:
                    raise NodeUnreachable(session_id, f"its node {self.node_id} did not answer "
                                          f"({exc!r})") from None
                current = self._current = _Connection(ws, self._answers)
            return current

    async def keep_open(self) -> None:
        """Open the channel if it is not (a node away is tried again at the next call)."""
        try:
            await self._connection("-")
        except NodeUnreachable as exc:
            logger.debug("channel to node %s not opened: %s", self.node_id, exc)

    @contextlib.asynccontextmanager
    async def stream(self, session_id: str, *, submit: Submit | None = None,
                     create: CreateSession | None = None, trace: dict[str, str] | None = None,
                     ) -> AsyncIterator[AsyncIterator[Frame]]:
        """Send an execution in ``session_id`` (its frames: ``accepted``, events, or
        ``error``) or a session to make (``created`` or ``error``; ``session_id`` then only
        names it in errors); its frames, to its end."""
        connection = await self._connection(session_id)
        number = next(self._numbers)
        queue: asyncio.Queue[ChannelFrame | None] = asyncio.Queue()
        connection.streams[number] = queue
        try:
            message = ChannelRequest(stream=number, session_id=None if create else session_id,
                                     submit=submit, create=create, trace=trace or {})
            try:
                await connection.ws.send(message.model_dump_json())
            except ConnectionClosed as exc:
                raise NodeUnreachable(session_id, f"its node {self.node_id} stopped answering "
                                      f"({exc!r})") from None
            yield self._frames(queue, session_id)
        finally:
            connection.streams.pop(number, None)

    async def _frames(self, queue: asyncio.Queue[ChannelFrame | None],
                      session_id: str) -> AsyncIterator[Frame]:
        while True:
            message = await queue.get()
            if message is None:
                raise NodeUnreachable(session_id, f"its node {self.node_id} stopped answering "
                                      "(its channel closed)")
            if message.frame is not None:
                yield message.frame
            if message.end:
                return

    async def close(self) -> None:
        current, self._current = self._current, None
        if current is not None:
            await current.ws.close()
            current.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await current.reader
