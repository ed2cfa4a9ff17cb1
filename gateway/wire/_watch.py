"""The frames of a folder watch's WebSocket (``/v1/sessions/{id}/files/watch``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

WatchChange = Literal["create", "write", "remove", "rename", "chmod"]


class WatchFrame(BaseModel):
    """A change in the watched folder: made or moved in (``create``), written, its mode or
    owner changed (``chmod``), deleted (``remove``), moved away (``rename``)."""

    type: WatchChange
    path: str
    """Relative to the workspace."""
    is_dir: bool


class WatchReadyFrame(BaseModel):
    """The first frame: the watch is in place; every change made from now on is sent."""

    type: Literal["ready"] = "ready"


class WatchEndFrame(BaseModel):
    """The last frame: the watch ended (the session paused or ended, the folder went, the
    client fell too far behind); the socket closes after it."""

    type: Literal["end"] = "end"
    reason: str
