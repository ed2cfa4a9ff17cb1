"""Code contexts: the kernels of a session, one per language or working folder, each with
its own variables.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from ._base import Strict

Language = Annotated[str, Field(max_length=32, description=(
    "python (the default), r, javascript (js), typescript (ts) or bash, any case; the "
    "session's image must offer it"))]
ContextId = Annotated[str, Field(min_length=1, max_length=64, description=(
    "a code context of the session (GET /v1/sessions/{id}/contexts)"))]


class ContextCreate(Strict):
    """``POST /v1/sessions/{id}/contexts``: another kernel of a language in the session."""

    language: Language = "python"
    cwd: str | None = Field(default=None, max_length=4096, description=(
        "the folder its kernel starts in (absolute, or relative to the workspace); it must "
        "exist and be the sandbox user's to enter. Default: the workspace"))


class ContextOut(BaseModel):
    """A code context: a kernel of the session, with its own variables."""

    id: str
    language: str = Field(description="python, r, javascript (TypeScript runs there too) "
                          "or bash")
    execution_count: int
    running: bool = Field(description="whether its kernel runs now (a context starts it at "
                          "its first execution)")
    cwd: str | None = Field(default=None, description="the folder its kernel starts in, as "
                            "asked; null: the workspace")
