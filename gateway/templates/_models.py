"""What one build of a custom template is asked (:class:`BuildSpec`); how the API describes a
template and its log are wire models (:mod:`gateway.wire`)."""

from __future__ import annotations

import re

from pydantic import BaseModel, Field, field_validator

from gateway.profiles import TEMPLATE_PREFIX

__all__ = ["ID_PREFIX", "BuildSpec"]

NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
"""A template's name: lower-case letters, digits, ``.``, ``_``, ``-``; at most 63 characters
(E2B's aliases are so; a name is unique per tenant)."""
ID_PREFIX = TEMPLATE_PREFIX
"""A template's id starts so, and its builds' profiles (``<id>-<build>``: tenants' names may
clash, ids never do)."""
MAX_DOCKERFILE = 64 * 1024


class BuildSpec(BaseModel):
    """One build of a template: a Dockerfile and its context (a tar, plain or gzipped)."""

    name: str
    dockerfile: str = Field(min_length=1, max_length=MAX_DOCKERFILE)
    context: bytes | None = Field(None, repr=False)
    """A tar of the files the Dockerfile's COPY/ADD read; None: none."""
    skip_cache: bool = False
    """Build every step again (the engine's layer cache unused)."""
    step_timeout_s: float | None = Field(None, gt=0, le=3600)
    """How long one step may take (None: the settings'); a step past it fails the build."""
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
