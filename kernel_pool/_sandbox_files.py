"""The models of the sandbox's own files, beyond its workspace (the port's ``sandbox_fs``,
``sandbox_read`` and ``sandbox_write``; served by :mod:`kernel_pool._sandbox_fs`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from kernel_pool._entries import Entry


class SandboxEntry(Entry):
    """A file or folder of the sandbox: ``path`` absolute; a link followed (``resolved`` the
    absolute path it leads to, its ``kind``, ``size`` and ``mode`` the target's)."""

    owner: int = 0
    """Its owner's uid in the sandbox (the sandbox's user is 1000, root 0)."""
    group: int = 0


class SandboxFsRequest(BaseModel):
    """One operation on the sandbox's files (reads and writes stream: see the port)."""

    op: Literal["stat", "list", "mkdir", "remove", "move"]
    path: str
    """Absolute, in the sandbox (normalized here: ``/tmp/../etc`` is ``/etc``)."""
    destination: str | None = None
    """``move``'s new path."""
    depth: int = Field(1, ge=1, le=64)
    """``list``'s levels below the folder."""


class SandboxFsAnswer(BaseModel):
    """What an operation answered: the entry it stat'ed, made or moved; a listing's entries
    (depth-first); whether ``mkdir`` made the folder."""

    entry: SandboxEntry | None = None
    entries: list[SandboxEntry] | None = None
    created: bool | None = None
