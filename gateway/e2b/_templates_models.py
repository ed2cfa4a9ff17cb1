"""The template API's wire (E2B's OpenAPI: TemplateBuildRequestV3, TemplateBuildStartV2,
TemplateBuildInfo, Template, ...), field names as E2B's SDKs send and read them.

Requests ignore fields this version does not know, as E2B's API does."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.e2b._models import ENVD_VERSION

BuildStatus = Literal["building", "waiting", "ready", "error"]
LogLevel = Literal["debug", "info", "warn", "error"]


class Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class BuildRequest(Lenient):
    """``POST /v3/templates``: a build of the template ``name`` (``alias:tag`` or ``alias``)
    is asked; its steps come with :class:`BuildStart`."""

    name: str | None = None
    alias: str | None = None
    """(E2B's deprecated name for ``name``.)"""
    tags: list[str] | None = None
    cpu_count: int | None = Field(None, alias="cpuCount", ge=1)
    memory_mb: int | None = Field(None, alias="memoryMB", ge=128)


class BuildRequested(BaseModel):
    """``TemplateRequestResponseV3``."""

    templateID: str
    buildID: str
    public: bool = False
    names: list[str]
    tags: list[str]
    aliases: list[str]


class Step(Lenient):
    """``TemplateStep``: one builder instruction (COPY, ENV, RUN, WORKDIR, USER)."""

    type: str
    args: list[str] = Field(default_factory=list)
    files_hash: str | None = Field(None, alias="filesHash")
    force: bool = False


class BuildStart(Lenient):
    """``TemplateBuildStartV2``: what the template is built from and its steps."""

    from_image: str | None = Field(None, alias="fromImage")
    from_template: str | None = Field(None, alias="fromTemplate")
    from_image_registry: dict[str, Any] | None = Field(None, alias="fromImageRegistry")
    force: bool = False
    steps: list[Step] = Field(default_factory=list, max_length=1000)
    start_cmd: str | None = Field(None, alias="startCmd")
    ready_cmd: str | None = Field(None, alias="readyCmd")


class FileUpload(BaseModel):
    """``TemplateBuildFileUpload``: whether the files of a hash are here, and where to put
    them if not."""

    present: bool
    url: str | None = None


class LogEntry(BaseModel):
    """``BuildLogEntry``."""

    timestamp: datetime
    message: str
    level: LogLevel = "info"
    step: str | None = None


class StatusReason(BaseModel):
    """``BuildStatusReason``: why a build failed, and its step (``base``, the instruction's
    1-based index, or ``finalize``: what replgate adds after the steps)."""

    message: str
    step: str | None = None
    logEntries: list[LogEntry] = Field(default_factory=list)


class BuildInfo(BaseModel):
    """``TemplateBuildInfo``: a build's status and its log from the asked offset."""

    templateID: str
    buildID: str
    status: BuildStatus
    logs: list[str] = Field(default_factory=list)
    logEntries: list[LogEntry] = Field(default_factory=list)
    reason: StatusReason | None = None


class BuildLogs(BaseModel):
    """``TemplateBuildLogsResponse``."""

    logs: list[LogEntry]


class AliasFound(BaseModel):
    """``TemplateAliasResponse``."""

    templateID: str
    public: bool


class BuildOut(BaseModel):
    """``TemplateBuild``: one build of a template."""

    buildID: str
    status: BuildStatus
    createdAt: datetime
    updatedAt: datetime
    cpuCount: int
    memoryMB: int
    envdVersion: str = ENVD_VERSION


class TemplateOut(BaseModel):
    """``Template`` (and with ``builds``, ``TemplateWithBuilds``)."""

    templateID: str
    buildID: str
    cpuCount: int
    memoryMB: int
    diskSizeMB: int
    public: bool
    aliases: list[str]
    names: list[str]
    createdAt: datetime
    updatedAt: datetime
    createdBy: None = None
    lastSpawnedAt: datetime | None = None
    spawnCount: int = 0
    buildCount: int
    envdVersion: str = ENVD_VERSION
    buildStatus: BuildStatus
    builds: list[BuildOut] | None = None


class TemplateUpdate(Lenient):
    """``TemplateUpdateRequest``: only ``public``, which is an operator's to set here."""

    public: bool | None = None


class TagsAssign(Lenient):
    """``AssignTemplateTagsRequest``: tags given to the build ``target`` (``alias:tag``)
    names."""

    target: str
    tags: list[str] = Field(min_length=1)


class TagsAssigned(BaseModel):
    """``AssignedTemplateTags``."""

    tags: list[str]
    buildID: str


class TagsRemove(Lenient):
    """``DeleteTemplateTagsRequest``."""

    name: str
    tags: list[str] = Field(min_length=1)


class TagOut(BaseModel):
    """``TemplateTag``."""

    tag: str
    buildID: str
    createdAt: datetime
