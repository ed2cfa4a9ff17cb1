"""The client's own wire models: a session, a file in its workspace."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel


class SessionInfo(BaseModel):
    """A session as the gateway describes it (CONTRACT.md's Session)."""

    id: str
    tenant: str
    profile: str
    status: str
    """``idle``, ``busy``, ``starting``, ``dead`` or ``paused``; kept a plain string so that a
    state added by a newer gateway does not break an older client."""
    execution_count: int
    created_at: datetime
    last_active_at: datetime
    paused_with: str | None = None
    """While paused: ``variables`` (the namespace was kept) or ``memory`` (the process)."""
    not_kept: dict[str, str] | None = None
    """While paused: variables that could not be kept, with the reason."""
    reason: str | None = None
    """Why the last pause, resume or fork failed."""


class FileInfo(BaseModel):
    """A file in the session's workspace; ``path`` is relative to the workspace."""

    path: str
    size: int
    modified: datetime | None = None
    """When it last changed; ``None`` in the answer to a write, which does not report it."""
