"""Interactive processes: a command's input over HTTP, and the terminal WebSocket's frames.

``GET /v1/sessions/{id}/terminal`` (a WebSocket) runs a command on a terminal; the server
sends :class:`TerminalStarted` first, :class:`TerminalOutput` as the terminal writes, and
:class:`TerminalExit` last; the client sends :class:`TerminalInput`, :class:`TerminalResize`
and :class:`TerminalKill`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from ._base import Strict

INPUT_CHARS = 1 << 20
"""One input message's characters at most."""


class CommandInput(Strict):
    """``POST /v1/sessions/{id}/commands/{command_id}/input``: text for its stdin or terminal."""

    data: str = Field(max_length=INPUT_CHARS, description="written as UTF-8")


class TerminalSize(Strict):
    """``POST /v1/sessions/{id}/commands/{command_id}/resize``: its terminal's new size."""

    cols: int = Field(ge=1, le=1000)
    rows: int = Field(ge=1, le=1000)


class TerminalStarted(BaseModel):
    type: Literal["started"] = "started"
    id: str
    """The terminal's id: a command id (input, kill), and ``?id=`` to reattach."""


class TerminalOutput(BaseModel):
    type: Literal["output"] = "output"
    data: str


class TerminalExit(BaseModel):
    type: Literal["exit"] = "exit"
    exit_code: int | None
    status: str
    """The command's status (``ok``, ``killed``, ``timeout``), or ``error`` (its session ended
    under it)."""


class TerminalInput(Strict):
    type: Literal["input"]
    data: str = Field(max_length=INPUT_CHARS)


class TerminalResize(Strict):
    type: Literal["resize"]
    cols: int = Field(ge=1, le=1000)
    rows: int = Field(ge=1, le=1000)


class TerminalKill(Strict):
    type: Literal["kill"]


TerminalClientMessage = Annotated[TerminalInput | TerminalResize | TerminalKill,
                                  Field(discriminator="type")]
"""What a terminal's client sends."""
