"""E2B's template catalog over replgate's templates: ``Template.exists`` (the aliases), the
listing, one template with its builds, its deletion, and tags (``assign_tags``, ``remove_tags``,
``get_tags``).

A tenant sees its own templates and the published ones; another tenant's is E2B's 404, as one
that does not exist (its name tells nothing). E2B's default templates (``base``, the code
interpreter's) exist for every tenant. Publishing (E2B's ``public``) is an operator's here.
These routes go before :mod:`._snapshots`' (whose ``DELETE /templates/{id}`` this one falls
back to).
"""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from common.errors import NotFound
from gateway.e2b._errors import E2BError, E2BRoute
from gateway.e2b._models import DEFAULT_TEMPLATES
from gateway.e2b._snapshots import SnapshotsDep, delete_snapshot
from gateway.e2b._templates import (
    DEFAULT_CPUS,
    DEFAULT_MEMORY_MB,
    STATUS,
    BuildsDep,
    TemplatesDep,
)
from gateway.e2b._templates_models import (
    AliasFound,
    BuildOut,
    TagOut,
    TagsAssign,
    TagsAssigned,
    TagsRemove,
    TemplateOut,
    TemplateUpdate,
)
from gateway.e2b._templates_state import TemplateBuilds, split_name
from gateway.e2b._tenant import TenantDep
from gateway.templates import TemplateInfo, Templates

router = APIRouter(prefix="/e2b", tags=["e2b"], route_class=E2BRoute)


@router.get("/templates/aliases/{alias}")
async def alias_exists(alias: str, tenant: TenantDep, builds: BuildsDep,
                       templates: TemplatesDep) -> AliasFound:
    """``Template.exists(name)``: 200 for the tenant's (or a published) template of that name,
    and for E2B's default templates; 404 otherwise."""
    if alias in DEFAULT_TEMPLATES:
        return AliasFound(templateID=alias, public=True)
    if await builds.asked(tenant, alias):
        return AliasFound(templateID=alias, public=False)
    try:
        info = await templates.get(tenant, alias)
    except NotFound:
        raise E2BError(404, f"template {alias!r} not found") from None
    return AliasFound(templateID=info.name, public=info.public)


async def _out(info: TemplateInfo, builds: TemplateBuilds, with_builds: bool) -> TemplateOut:
    asked = await builds.builds_of(info.tenant, info.name)
    latest = max(asked, key=lambda b: b.created_at) if asked else None
    out = TemplateOut(
        templateID=info.name, buildID=latest.build_id if latest else info.build_id,
        cpuCount=latest.cpu_count if latest else DEFAULT_CPUS,
        memoryMB=latest.memory_mb if latest else DEFAULT_MEMORY_MB,
        diskSizeMB=(info.image_size or 0) >> 20, public=info.public, aliases=[info.name],
        names=[info.name], createdAt=info.created_at, updatedAt=info.updated_at,
        buildCount=info.builds, buildStatus=STATUS[info.status])
    if with_builds:
        out.builds = [BuildOut(
            buildID=b.build_id,
            status=STATUS[info.status] if b.core == info.build_id else (
                "waiting" if b.core is None else "ready"),
            createdAt=b.created_at, updatedAt=info.updated_at if b.core == info.build_id
            else b.created_at, cpuCount=b.cpu_count, memoryMB=b.memory_mb) for b in asked]
    return out


@router.get("/templates")
@router.get("/v2/templates")
async def list_templates(tenant: TenantDep, builds: BuildsDep,
                         templates: TemplatesDep) -> list[TemplateOut]:
    """The tenant's templates and the published ones, newest first."""
    return [await _out(info, builds, False) for info in await templates.list(tenant)]


@router.get("/templates/{template_id}")
async def get_template(template_id: str, tenant: TenantDep, builds: BuildsDep,
                       templates: TemplatesDep) -> TemplateOut:
    """One template with its builds (those asked through E2B's API)."""
    return await _out(await templates.get(tenant, template_id), builds, True)


@router.patch("/templates/{template_id}")
@router.patch("/v2/templates/{template_id}")
async def update_template(template_id: str, body: TemplateUpdate, tenant: TenantDep,
                          templates: TemplatesDep) -> dict[str, list[str]]:
    """E2B's ``public`` flag: publishing is an operator's on replgate (``docs/templates.md``),
    so a tenant may only leave it as it is."""
    info = await templates.get(tenant, template_id)
    if body.public is not None and body.public != info.public:
        raise E2BError(403, "on replgate an operator publishes a template to every tenant; "
                            "a tenant's key cannot change it")
    return {"names": [info.name]}


async def _owned(templates: Templates, tenant: str, alias: str) -> TemplateInfo:
    info = await templates.get(tenant, alias)
    if info.tenant != tenant:
        raise E2BError(403, f"template {alias!r} is published by an operator: its tags are not "
                            "yours to change")
    return info


@router.post("/templates/tags", status_code=status.HTTP_201_CREATED)
async def assign_tags(body: TagsAssign, tenant: TenantDep, builds: BuildsDep,
                      templates: TemplatesDep) -> TagsAssigned:
    """``assign_tags``: the build ``target`` (``alias:tag``, or ``alias``: its latest) is
    given ``tags`` as well."""
    alias, tag = split_name(body.target)
    if not await builds.asked(tenant, alias):
        await _owned(templates, tenant, alias)
        raise E2BError(404, f"template {alias!r} has no builds made through E2B's API, so "
                            "none to tag")
    build_id = await builds.tagged(tenant, alias, tag)
    await builds.tag(tenant, alias, build_id, body.tags)
    return TagsAssigned(tags=body.tags, buildID=build_id)


@router.delete("/templates/tags", status_code=status.HTTP_204_NO_CONTENT)
async def remove_tags(body: TagsRemove, tenant: TenantDep, builds: BuildsDep) -> Response:
    """``remove_tags``: the template ``name`` loses ``tags``."""
    alias, _ = split_name(body.name)
    await builds.untag(tenant, alias, body.tags)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/templates/{template_id}/tags")
async def get_tags(template_id: str, tenant: TenantDep, builds: BuildsDep,
                   templates: TemplatesDep) -> list[TagOut]:
    """``get_tags``: the template's tags and the build each names."""
    alias, _ = split_name(template_id)
    if not await builds.asked(tenant, alias):
        await templates.get(tenant, alias)  # NotFound: not the tenant's
    return [TagOut(tag=tag, buildID=held.build_id, createdAt=held.created_at)
            for tag, held in sorted((await builds.tags(tenant, alias)).items(),
                                    key=lambda item: item[1].created_at)]


@router.delete("/templates/{template_id}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_template(template_id: str, tenant: TenantDep, builds: BuildsDep,
                          templates: TemplatesDep, snapshots: SnapshotsDep) -> Response:
    """The template is deleted, its images with it; sessions of it go on. Not a template of
    the tenant's: a snapshot's deletion (E2B keeps snapshots as templates; :mod:`._snapshots`).
    (After the tag routes: ``/templates/tags`` is theirs.)"""
    try:
        info = await templates.get(tenant, template_id)
    except NotFound:
        return await delete_snapshot(template_id, tenant, snapshots)
    if info.tenant != tenant:
        raise E2BError(403, f"template {template_id!r} is published by an operator; only an "
                            "operator deletes it")
    await templates.delete(tenant, template_id)
    await builds.forget(tenant, info.name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
