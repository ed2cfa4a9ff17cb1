"""Secrets: ``PUT /v1/secrets/{name}`` and ``GET /v1/secrets`` (docs/secrets.md)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, SecretStr


class SecretIn(BaseModel):
    """A secret's new value (write-only: no answer ever holds it)."""

    model_config = ConfigDict(extra="forbid")

    value: SecretStr
    """Checked by the gateway (length, header-safe characters) with answers that never echo it."""


class SecretOut(BaseModel):
    """A secret as listed: its name and times, never its value."""

    name: str
    created_at: datetime
    updated_at: datetime
