"""The gateway's health check (``GET /health``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class Health(BaseModel):
    status: Literal["ok"]
    version: str
    pool: dict[str, int]
