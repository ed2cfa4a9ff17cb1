"""E2B's template builds (``Template.build``, ``build_in_background``, ``get_build_status``) as
replgate's custom templates (``gateway.templates``, ``docs/templates.md``).

The SDK's build is four calls: ``POST /v3/templates`` names the build (E2B's template id is the
name here, its build id a new UUID); ``GET /templates/{id}/files/{hash}`` and a PUT to the URL
answered upload each ``copy`` step's files (:mod:`._templates_files`); ``POST
/v2/templates/{id}/builds/{build}`` sends the base and steps, which become a Dockerfile
(:mod:`._templates_dockerfile`) built by replgate; ``GET .../status`` is polled for the status
and the log. What replgate cannot build from (a private registry's credentials) is E2B's 400
with a sentence; a base image the engine does not have, when no registry is reachable, fails
the build (step ``base``) with the engine's reason.
"""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Query, Request, Response, status

from gateway.deps import GatewayDep
from gateway.e2b._errors import E2BError, E2BRoute, unsupported
from gateway.e2b._models import DEFAULT_TEMPLATES
from gateway.e2b._templates_dockerfile import SANDBOX_USER, context, outward_links, translate
from gateway.e2b._templates_files import check_hash
from gateway.e2b._templates_models import (
    BuildInfo,
    BuildLogs,
    BuildRequest,
    BuildRequested,
    BuildStart,
    BuildStatus,
    FileUpload,
    LogEntry,
    LogLevel,
    StatusReason,
)
from gateway.e2b._templates_state import (
    DEFAULT_TAG,
    Build,
    TemplateBuilds,
    builds_of_app,
    core_templates,
    split_name,
)
from gateway.e2b._tenant import TenantDep
from gateway.templates import BuildSpec, LogLine, TemplateInfo, Templates, TemplateStatus

router = APIRouter(prefix="/e2b", tags=["e2b"], route_class=E2BRoute)
uploads_router = APIRouter(prefix="/e2b", tags=["e2b"], route_class=E2BRoute)
"""The upload URL: no API key (E2B's SDK sends none there), its signature instead."""

BuildsDep = Annotated[TemplateBuilds, Depends(builds_of_app)]
TemplatesDep = Annotated[Templates, Depends(core_templates)]

E2B_BASE_IMAGE = "e2bdev/base"
"""E2B's base image (``from_base_image()``): replgate's sandbox image stands for it."""
DEFAULT_CPUS = 2
DEFAULT_MEMORY_MB = 1024
STATUS_LOG_LIMIT = 100
"""Log lines a status answer carries at most (as E2B's)."""
STATUS: dict[TemplateStatus, BuildStatus] = {
    TemplateStatus.BUILDING: "building", TemplateStatus.READY: "ready",
    TemplateStatus.FAILED: "error"}


@router.post("/v3/templates", status_code=status.HTTP_202_ACCEPTED)
async def request_build(body: BuildRequest, tenant: TenantDep,
                        builds: BuildsDep) -> BuildRequested:
    """A build of the template ``name`` (``alias:tag``), tagged ``tag`` and ``tags``
    (``default`` when none); it starts when its steps come."""
    name = body.name or body.alias
    if not name:
        raise E2BError(400, "a build names its template: name (alias:tag)")
    alias, tag = split_name(name)
    tags = list(dict.fromkeys([*([tag] if tag else []), *(body.tags or [])])) or [DEFAULT_TAG]
    build = await builds.ask(tenant, alias, tags, body.cpu_count or DEFAULT_CPUS,
                       body.memory_mb or DEFAULT_MEMORY_MB)
    return BuildRequested(templateID=alias, buildID=build.build_id, names=[alias], tags=tags,
                          aliases=[alias])


@router.get("/templates/{template_id}/files/{files_hash}", status_code=status.HTTP_201_CREATED,
            response_model_exclude_none=True)
async def file_upload_link(template_id: str, files_hash: str, request: Request,
                           tenant: TenantDep, builds: BuildsDep,
                           templates: TemplatesDep) -> FileUpload:
    """Whether the files of ``files_hash`` are here for the tenant, and a URL that puts them
    (also when present: the SDK's ``force_upload`` puts them again)."""
    check_hash(files_hash)
    if not await builds.asked(tenant, template_id):
        await templates.get(tenant, template_id)  # NotFound: not the tenant's
    return FileUpload(present=await builds.uploads.present(tenant, files_hash),
                      url=builds.uploads.url(request, tenant, files_hash))


@uploads_router.put("/templates/uploads/{files_hash}", name="e2b_template_upload")
async def upload(files_hash: str, request: Request, builds: BuildsDep,
                 tenant: Annotated[str, Query()], expires: Annotated[int, Query()],
                 signature: Annotated[str, Query()]) -> Response:
    """The tar of a ``copy`` step's files, put to the URL :func:`file_upload_link` made."""
    builds.uploads.check(tenant, files_hash, expires, signature)
    await builds.uploads.receive(request, tenant, files_hash)
    return Response(status_code=status.HTTP_200_OK)


async def _base(start: BuildStart, tenant: str, templates: Templates,
                default_image: str) -> tuple[str, str]:
    """The image the build starts FROM, and its user (E2B's base: the default profile's)."""
    if start.from_image_registry:
        kind = start.from_image_registry.get("type") or "registry"
        raise unsupported(f"a registry's credentials (fromImageRegistry of type {kind!r})",
                          "the engine builds from the images it has or can pull without them")
    if start.from_template is not None:
        if start.from_template in DEFAULT_TEMPLATES:
            return default_image, SANDBOX_USER
        base: TemplateInfo = await templates.get(tenant, start.from_template.partition(":")[0])
        if base.status is not TemplateStatus.READY or base.image is None:
            raise E2BError(400, f"template {start.from_template!r} is not ready to build from")
        return base.image, SANDBOX_USER
    if start.from_image is None:
        raise E2BError(400, "a build names its base: fromImage or fromTemplate")
    if start.from_image.split(":")[0] == E2B_BASE_IMAGE:
        return default_image, SANDBOX_USER
    return start.from_image, "root"


@router.post("/v2/templates/{template_id}/builds/{build_id}",
             status_code=status.HTTP_202_ACCEPTED)
async def start_build(template_id: str, build_id: str, body: BuildStart, tenant: TenantDep,
                      builds: BuildsDep, templates: TemplatesDep,
                      gateway: GatewayDep) -> Response:
    """The steps of an asked build: translated to a Dockerfile, built by replgate."""
    build = await builds.build(tenant, template_id, build_id)
    if build.core is not None:
        raise E2BError(409, f"build {build_id} has started already")
    image, user = await _base(body, tenant, templates,
                              gateway.pool.profile("default").image)
    hashes = list(dict.fromkeys(check_hash(step.files_hash) for step in body.steps
                                if step.type.upper() == "COPY" and step.files_hash))
    missing = [h for h in hashes if not await builds.uploads.present(tenant, h)]
    if missing:
        raise E2BError(400, f"the files of {len(missing)} copy step(s) were not uploaded "
                            f"(hash {missing[0]}): upload them first")
    for files_hash in hashes:  # (uploaded to another gateway: in the bundle store)
        await builds.uploads.fetch(tenant, files_hash)
    links = await anyio.to_thread.run_sync(
        outward_links, hashes, lambda h: builds.uploads.path(tenant, h))
    translation = translate(body, image, user, build_id, links)
    tar = (await anyio.to_thread.run_sync(
        context, translation.copies, lambda h: builds.uploads.path(tenant, h))
        if translation.copies else None)
    info = await templates.start(tenant, BuildSpec(
        name=template_id, dockerfile=translation.dockerfile, context=tar,
        skip_cache=body.force, start_cmd=body.start_cmd, ready_cmd=body.ready_cmd))
    await builds.started(build, info.build_id, translation)
    return Response(status_code=status.HTTP_202_ACCEPTED)


def _entry(line: LogLine) -> LogEntry:
    return LogEntry(timestamp=line.at, message=line.text,
                    level="error" if line.error else "info")


def _wanted(lines: list[LogLine], level: LogLevel | None) -> list[LogLine]:
    if level == "error":
        return [line for line in lines if line.error]
    return lines


async def _started(build: Build, tenant: str,
                   templates: Templates) -> tuple[TemplateInfo | None, BuildStatus]:
    """The template of a started build, and the build's status as E2B's."""
    if build.core is None:
        return None, "waiting"
    info = await templates.get(tenant, build.alias)
    if info.build_id != build.core:  # an earlier build: it ended, as it did
        return info, "ready"
    return info, STATUS[info.status]


@router.get("/templates/{template_id}/builds/{build_id}/status", response_model_exclude_none=True)
async def build_status(
        template_id: str, build_id: str, tenant: TenantDep, builds: BuildsDep,
        templates: TemplatesDep,
        logs_offset: Annotated[int, Query(alias="logsOffset", ge=0)] = 0,
        limit: Annotated[int, Query(ge=0, le=STATUS_LOG_LIMIT)] = STATUS_LOG_LIMIT,
        level: LogLevel | None = None) -> BuildInfo:
    """``get_build_status``: the build's status and its log lines from ``logsOffset``; a
    failed build's reason names its step."""
    build = await builds.build(tenant, template_id, build_id)
    info, state = await _started(build, tenant, templates)
    if build.core is None:
        return BuildInfo(templateID=template_id, buildID=build_id, status=state)
    lines = await templates.logs(tenant, template_id, offset=logs_offset, build_id=build.core)
    entries = [_entry(line) for line in _wanted(lines, level)[:limit]]
    reason = None
    if state == "error" and info is not None:
        step = (build.translation.step_of(info.failed_line)
                if build.translation is not None else None)
        tail = await templates.logs(tenant, template_id, build_id=build.core)
        reason = StatusReason(message=info.error or "the build failed", step=step,
                              logEntries=[_entry(line) for line in tail[-20:]])
    return BuildInfo(templateID=template_id, buildID=build_id, status=state,
                     logEntries=entries, reason=reason)


@router.get("/templates/{template_id}/builds/{build_id}/logs", response_model_exclude_none=True)
async def build_logs(
        template_id: str, build_id: str, tenant: TenantDep, builds: BuildsDep,
        templates: TemplatesDep, cursor: Annotated[int | None, Query(ge=0)] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        direction: Annotated[str, Query(pattern="^(forward|backward)$")] = "forward",
        level: LogLevel | None = None) -> BuildLogs:
    """A build's log lines: from ``cursor`` (a Unix time in milliseconds) forward, or before
    it backward, at most ``limit``."""
    build = await builds.build(tenant, template_id, build_id)
    if build.core is None:
        return BuildLogs(logs=[])
    lines = _wanted(await templates.logs(tenant, template_id, build_id=build.core), level)
    if cursor is not None:
        at = cursor / 1000
        lines = [line for line in lines if (line.at.timestamp() >= at) == (direction ==
                                                                           "forward")]
    lines = lines[-limit:] if direction == "backward" else lines[:limit]
    return BuildLogs(logs=[_entry(line) for line in lines])
