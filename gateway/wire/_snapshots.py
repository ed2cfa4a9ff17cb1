"""Saved snapshots (``docs/snapshots.md``): the request that saves a session, how the API
describes a snapshot, and the request that makes a session from one."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, Field

from ._base import EnvName, Strict


class SnapshotCreate(Strict):
    """``POST /v1/sessions/{id}/snapshots``: save the session; it goes on unchanged."""

    name: str | None = Field(None, max_length=128, description="unique per tenant: a snapshot "
                             "of the same name is replaced by this one")
    memory: bool = Field(True, description="keep the kernel's variables (as a pause does); "
                         "false: the files alone, and sessions made from it start on a fresh "
                         "kernel")


class SnapshotOut(BaseModel):
    """A saved snapshot of the tenant."""

    id: str
    name: str | None
    session_id: str = Field(description="the session it was taken of (it may have ended)")
    profile: str = Field(description="the profile its sessions run on")
    memory: bool
    kept: list[str] = Field(description="the variables it keeps")
    not_kept: dict[str, str] = Field(description="what it does not keep, each with the reason")
    size_bytes: int = Field(description="what it takes in the bundle store")
    created_at: datetime


class SnapshotSessionCreate(Strict):
    """``POST /v1/snapshots/{id}/sessions``: a new session, a copy of the snapshot."""

    env: dict[EnvName, Annotated[str, Field(max_length=32_768)]] = Field(
        default_factory=dict, max_length=256, description="over the snapshot's environment")
    metadata: dict[str, Any] = Field(default_factory=dict)
