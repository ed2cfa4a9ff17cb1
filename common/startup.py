"""A start-up that fails for a reason the operator fixes is told in one line, not a traceback.

uvicorn runs the app's lifespan; when it raises, Starlette hands uvicorn the formatted
traceback, which it logs, and uvicorn exits. :class:`StartupGuard` sits between them: an
exception of the kinds its caller names (a database that cannot be reached, a runtime the
engine lacks, a node id taken: their messages name the setting and what to do) is kept for
the command to print as its one line, and its traceback is left out of the log; any other
exception is a bug, and keeps its traceback.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import socket

    from starlette.types import ASGIApp, Message, Receive, Scope, Send

_UVICORN_SAYS = "Application startup failed"


class StartupRefused(ValueError):
    """A process cannot start as configured; the message is the one line to print."""


class StartupGuard:
    """ASGI middleware around ``app`` keeping the start-up failure among ``refusals``."""

    def __init__(self, app: ASGIApp, refusals: tuple[type[BaseException], ...]) -> None:
        self.app = app
        self.refusals = refusals
        self.refused: BaseException | None = None
        """The refusal the lifespan's start-up raised, for the command to print."""
        self._traceback = ""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def send_later(message: Message) -> None:
            # Starlette sends the failure, then raises: whether the traceback is worth
            # logging is known once the exception arrives here.
            if message["type"] == "lifespan.startup.failed":
                self._traceback = message.get("message", "")
                message = {**message, "message": ""}
            await send(message)

        try:
            await self.app(scope, receive, send_later)
        except self.refusals as exc:
            if not self._traceback:
                raise
            self.refused = exc
            raise
        except BaseException:
            if self._traceback:
                logging.getLogger("uvicorn.error").error(self._traceback)
            raise

    def filter(self, record: logging.LogRecord) -> bool:
        """A logging filter for uvicorn's logger: its "startup failed" line goes, as the
        command's own line says why."""
        return self.refused is None or not record.getMessage().startswith(_UVICORN_SAYS)

    def line(self) -> str | None:
        """The refusal's message, one line, or None if start-up was not refused."""
        if self.refused is None:
            return None
        return " ".join(str(self.refused).split()) or type(self.refused).__name__


def serve_guarded(app: ASGIApp, refusals: tuple[type[BaseException], ...],
                  sock: socket.socket, **config: Any) -> str | None:
    """Serve ``app`` with uvicorn (``config``: its options) on ``sock`` until stopped; the one
    line to print if its start-up was refused with one of ``refusals``, else None."""
    import uvicorn

    guard = StartupGuard(app, refusals)
    logging.getLogger("uvicorn.error").addFilter(guard.filter)
    try:
        uvicorn.Server(uvicorn.Config(guard, **config)).run(sockets=[sock])
    except SystemExit:  # uvicorn's exit when the start-up failed
        if guard.line() is None:
            raise
    return guard.line()

