"""Custom templates (``docs/templates.md``): the JSON request that builds one, how the API
describes a template, and one line of a build's log (``POST /v1/templates`` also takes a
multipart form: ``dockerfile``, ``context`` as a tar, ``name``)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field

from ._base import Strict


class TemplateStatus(StrEnum):
    """A template's state: its latest build's."""

    BUILDING = "building"
    READY = "ready"
    FAILED = "failed"


class TemplateCreate(Strict):
    """``POST /v1/templates`` as JSON: build a template (a rebuild when the tenant has one of
    that name)."""

    name: str = Field(description="unique per tenant: 1 to 63 of a-z, 0-9, '.', '_', '-'")
    dockerfile: str = Field(description="the Dockerfile's text; FROM an image the engine has")
    context: str | None = Field(None, description="base64 of a tar (plain or gzipped) of the "
                                "files its COPY and ADD read")
    skip_cache: bool = Field(False, description="build every step again, the layer cache unused")
    step_timeout_s: float | None = Field(None, gt=0, description="how long one step may take "
                                         "(default REPLGATE_TEMPLATE_STEP_TIMEOUT_S)")
    start_cmd: str | None = Field(None, description="started in each sandbox of it (E2B's "
                                  "set_start_cmd)")
    ready_cmd: str | None = Field(None, description="polled after start_cmd until it exits 0")


class TemplatePublish(Strict):
    """``POST /v1/templates/{id}/publish`` (an operator's key): who may use the template."""

    public: bool = Field(True, description="true: every tenant; false: its own tenant alone")


class TemplateInfo(BaseModel):
    """A tenant's template, as its latest build left it."""

    id: str
    name: str
    tenant: str
    status: TemplateStatus
    error: str | None = Field(None, description="why the latest build failed: the step (the "
                              "Dockerfile's line) and its last output")
    failed_line: int | None = Field(None, description="the 1-based line of the Dockerfile whose "
                                    "step failed; null for replgate's own steps")
    created_at: datetime
    updated_at: datetime
    build_id: str = Field(description="the latest build (a rebuild is a new build)")
    builds: int = 1
    image: str | None = Field(None, description="the engine's tag of the ready image")
    image_size: int | None = Field(None, description="bytes of the ready image")
    profile: str = Field(description="what sessions of it name as their profile (its id; its "
                         "tenant may name it by its name too)")
    languages: list[str] = Field(default_factory=list, description="the kernels it runs")
    lacks: list[str] = Field(default_factory=list, description="the default image's languages "
                             "it lacks (a template FROM another base)")
    public: bool = Field(False, description="published by an operator to every tenant")
    start_cmd: str | None = None
    ready_cmd: str | None = None


class LogLine(BaseModel):
    """One line of a build's log (the WebSocket sends each as it comes)."""

    offset: int = Field(description="the line's index in its build's log, from 0")
    build_id: str
    at: datetime
    text: str
    error: bool = False
