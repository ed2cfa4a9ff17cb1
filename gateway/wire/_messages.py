"""WebSocket client messages: what a client sends on a session's socket."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ._base import Strict, Timeout
from ._commands import CommandRequest
from ._contexts import ContextId, Language


class WsExecute(Strict):
    type: Literal["execute"]
    traceparent: str | None = Field(None, max_length=256, description="W3C trace context: the "
                                    "trace the execution's spans join (else the socket's)")
    tracestate: str | None = Field(None, max_length=4096)
    code: str
    timeout_s: Timeout | None = None
    id: str | None = Field(None, min_length=1, max_length=128)
    language: Language | None = None
    context_id: ContextId | None = None


class WsInterrupt(Strict):
    type: Literal["interrupt"]


class WsCommand(CommandRequest):
    """Run a shell command; its output streams as ``stdout``/``stderr`` events, then ``done``
    with ``exit_code``, each with the command's id as ``execution_id`` and ``command_id``."""

    type: Literal["command"]


class WsKillCommand(Strict):
    type: Literal["kill_command"]
    id: str


WsClientMessage = Annotated[WsExecute | WsInterrupt | WsCommand | WsKillCommand,
                            Field(discriminator="type")]
