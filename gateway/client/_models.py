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
    """``idle``, ``busy``, ``starting`` or ``dead``; kept a plain string so that a state added
    by a newer gateway does not break an older client."""
    execution_count: int
    created_at: datetime
    last_active_at: datetime


class FileInfo(BaseModel):
    """A file in the session's workspace; ``path`` is relative to the workspace."""

    path: str
    size: int
    modified: datetime | None = None
    """When it last changed; ``None`` in the answer to a write, which does not report it."""
