"""What the wire's rooms share: the base of every request body (unknown keys are refused)
and the field types several requests use.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

EnvName = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
Timeout = Annotated[float, Field(gt=0, description="seconds; at most the profile's maximum")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
