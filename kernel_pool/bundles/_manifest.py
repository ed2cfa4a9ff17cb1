"""A bundle's manifest: what a node must know before it restores one, and what each part
must read back as."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field


class BundleInfo(BaseModel):
    """What the pausing node states about a paused session, for the resuming one to check."""

    paused_with: Literal["memory", "variables"] = Field(
        description="memory: a CRIU image (restorable only on a compatible host); variables: "
        "a snapshot of the kernel's variables, restorable on any node")
    image_digest: str = Field(description="the sandbox image the session ran (its digest)")
    criu_version: str | None = Field(None, description="CRIU that took the memory image")
    kernel_version: str | None = Field(None, description="the host's kernel (uname -r) the "
                                       "memory image was taken on")
    kept: list[str] = Field(default_factory=list, description="the variables the snapshot kept")
    not_kept: dict[str, str] = Field(
        default_factory=dict, description="what the bundle does not hold, each with the reason "
        "(as a paused session's not_kept says it)")
    reseed: bool = Field(False, description="a fork's copy that never ran: its random "
                         "generators start afresh when it resumes")
    contexts: dict[str, str] = Field(
        default_factory=dict, description="the session's code contexts but its Python one, "
        "id to language: the resuming node lists them, and starts each one's kernel afresh at "
        "its next execution, which says so (a bundle holds Python's variables alone)")


class Part(BaseModel):
    """One part of a bundle as it was written (before sealing)."""

    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Manifest(BundleInfo):
    """The object written last, which commits a bundle: its parts, their sizes and hashes."""

    format: Literal[1] = 1
    tenant: str
    session_id: str
    generation: str = Field(description="the folder of this write's parts, so a new pause "
                            "never overwrites the parts a committed manifest names")
    created_at: datetime
    sealed: bool = Field(description="whether the parts are encrypted with the tenant's key")
    parts: dict[str, Part]
