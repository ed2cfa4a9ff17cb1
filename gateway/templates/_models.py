"""Custom templates' models: what a build is asked (:class:`BuildSpec`), what a template is
(:class:`TemplateInfo`) and one line of a build's log (:class:`LogLine`)."""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field, field_validator

__all__ = ["BuildSpec", "LogLine", "TemplateInfo", "TemplateStatus"]

NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
"""A template's name: lower-case letters, digits, ``.``, ``_``, ``-``; at most 63 characters
(E2B's aliases are so; a name is unique per tenant)."""
ID_PREFIX = "tpl_"
"""A template's id starts so; it is also the name of its profile (tenants' names may clash,
ids never do)."""
MAX_DOCKERFILE = 64 * 1024


class TemplateStatus(StrEnum):
    """A template's state: its latest build's."""

    BUILDING = "building"
    READY = "ready"
    FAILED = "failed"


class BuildSpec(BaseModel):
    """One build of a template: a Dockerfile and its context (a tar, plain or gzipped)."""

    name: str
    dockerfile: str = Field(min_length=1, max_length=MAX_DOCKERFILE)
    context: bytes | None = Field(None, repr=False)
    """A tar of the files the Dockerfile's COPY/ADD read; None: none."""
    skip_cache: bool = False
    """Build every step again (the engine's layer cache unused)."""
    step_timeout_s: float = Field(600.0, gt=0, le=3600)
    """How long one step may take; a step past it fails the build, named."""
    start_cmd: str | None = None
    """A command started in the sandbox once its kernel runs (E2B's ``set_start_cmd``)."""
    ready_cmd: str | None = None
    """Polled after ``start_cmd`` until it exits 0: the build fails if it never does."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME.fullmatch(value) or value.startswith(ID_PREFIX):
            raise ValueError("a template's name is 1 to 63 lower-case letters, digits, '.', "
                             f"'_' or '-', starting with a letter or digit, not with {ID_PREFIX!r}")
        return value


class TemplateInfo(BaseModel):
    """A tenant's template, as its latest build left it."""

    id: str
    name: str
    tenant: str
    status: TemplateStatus
    error: str | None = None
    """Why the latest build failed: the step (its Dockerfile line) and its last output."""
    failed_line: int | None = None
    """The 1-based line of the Dockerfile whose step failed (None: not a step's failure)."""
    created_at: datetime
    updated_at: datetime
    build_id: str
    """The latest build's id (a rebuild is a new build of the same template)."""
    builds: int = 1
    image: str | None = None
    """The engine's tag of the ready image."""
    image_size: int | None = None
    """Bytes of the ready image."""
    profile: str
    """The profile sessions of it take (``{"profile": ...}``): the template's id."""
    languages: list[str] = Field(default_factory=list)
    """The kernels it runs (``python`` always; the base's others when FROM the sandbox image)."""
    lacks: list[str] = Field(default_factory=list)
    """The default image's languages it does not have (FROM another base)."""
    public: bool = False
    """Published by an operator: every tenant may start sessions of it."""
    start_cmd: str | None = None
    ready_cmd: str | None = None


class LogLine(BaseModel):
    """One line of a build's log; ``offset`` counts the build's lines from 0."""

    offset: int
    build_id: str
    at: datetime
    text: str
    error: bool = False
