"""Refusals sent before their request's body was read, which the client must still get.

An upload refused for its size (413) is answered before its body is read: from its
``Content-Length``, or as soon as it passes the cap. The server then closes the connection
with the rest of the body unread, which resets it under a client that is still sending (as
HTTP/1.1 clients do before they read an answer): the client reports a broken connection, never
the 413 and its sentence. Here the rest of such a body is read and dropped before the answer
goes out, up to a bound in bytes and time (past it, the connection closes as before).
"""

from __future__ import annotations

import asyncio

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

DRAIN_BYTES = 256 << 20
"""The most of a refused body read to let its client see the answer."""
DRAIN_S = 30.0
"""The longest a refused body is read for."""
_DRAINED = frozenset({413})


class DrainRefusedBodies:
    """ASGI middleware: the unread rest of a refused request's body is read before the
    refusal is sent (see the module's docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        whole = False

        async def receiving() -> Message:
            nonlocal whole
            message = await receive()
            whole = whole or _last(message)
            return message

        async def sending(message: Message) -> None:
            nonlocal whole
            if (message["type"] == "http.response.start" and message["status"] in _DRAINED
                    and not whole):
                whole = await _drain(receive)
            await send(message)

        await self.app(scope, receiving, sending)


def _last(message: Message) -> bool:
    return message["type"] == "http.disconnect" or not message.get("more_body", False)


async def _drain(receive: Receive) -> bool:
    """Read and drop the body's rest, within the bounds; whether it ended."""
    read = 0
    try:
        async with asyncio.timeout(DRAIN_S):
            while read <= DRAIN_BYTES:
                message = await receive()
                read += len(message.get("body", b""))
                if _last(message):
                    return True
    except TimeoutError:
        pass
    return False


def install(app: FastAPI) -> None:
    """Drain refused bodies on every route of ``app``."""
    app.add_middleware(DrainRefusedBodies)
