"""Jupyter's kernel API (``/api/kernels``): a kernel as jupyter_server's gateway client asks
for and reads it (a replgate session).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from ._base import EnvName


class KernelCreate(BaseModel):
    """``POST /api/kernels``: what jupyter_server's gateway client sends (other keys ignored)."""

    model_config = ConfigDict(extra="ignore")
    name: str | None = Field(None, max_length=128)
    env: dict[EnvName, Annotated[str, Field(max_length=32_768)]] = Field(
        default_factory=dict, max_length=256)


class KernelModel(BaseModel):
    """A kernel as Jupyter's REST API describes it (a replgate session)."""

    id: str
    name: str
    last_activity: str
    execution_state: str
    connections: int
