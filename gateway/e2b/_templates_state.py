"""What the E2B face keeps of its template builds: the builds asked and not yet started, which
replgate build each of E2B's build ids is, the Dockerfile's steps (to name a failed step as
E2B's), and tags. Kept in the database (:mod:`gateway.records.e2b_templates`): another gateway,
or this one restarted, answers a build's status and a template's tags as this one would.

E2B's template id is the template's name here (E2B's alias: ``name`` before any ``:tag``), the
name replgate's templates are found by; sessions run on the template's profile.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

from fastapi import Request

from common.errors import NotFound
from gateway.e2b._errors import E2BError
from gateway.e2b._models import DEFAULT_TEMPLATES
from gateway.e2b._templates_dockerfile import Translation
from gateway.e2b._templates_files import Uploads
from gateway.records.e2b_templates import E2BBuildRecord
from gateway.store import Store
from gateway.templates import TemplateInfo, Templates, TemplateStatus

DEFAULT_TAG = "default"
"""E2B's tag of a build asked without one."""
_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")


@dataclass
class Build:
    """One of E2B's builds: asked (``core`` None) or started as replgate's build ``core``."""

    tenant: str
    alias: str
    build_id: str
    cpu_count: int
    memory_mb: int
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    core: str | None = None
    translation: Translation | None = None


@dataclass
class Tag:
    build_id: str
    created_at: datetime


def split_name(name: str) -> tuple[str, str | None]:
    """E2B's ``alias:tag`` as (alias, tag); E2B's 400 for a malformed one."""
    alias, colon, tag = name.partition(":")
    if not _NAME.fullmatch(alias):
        raise E2BError(400, f"a template's name is 1 to 63 lower-case letters, digits, '.', "
                            f"'_' or '-', starting with a letter or digit, not {alias!r}")
    if colon:
        check_tag(tag)
    return alias, tag if colon else None


def check_tag(tag: str) -> str:
    if not _TAG.fullmatch(tag):
        raise E2BError(400, f"a tag is 1 to 128 letters, digits, '.', '_' or '-', starting with "
                            f"a letter or digit, not {tag!r}")
    return tag


class TemplateBuilds:
    """E2B's builds and tags of every tenant, over replgate's templates."""

    def __init__(self, uploads: Uploads, store: Store) -> None:
        self.uploads = uploads
        self.store = store
        """Where the builds and tags are kept (every gateway, and a restarted one, reads
        them)."""

    async def ask(self, tenant: str, alias: str, tags: list[str], cpu_count: int,
                  memory_mb: int) -> Build:
        """A new build of ``alias``, tagged ``tags``, waiting for its steps."""
        for tag in tags:
            check_tag(tag)
        build = Build(tenant, alias, str(uuid.uuid4()), cpu_count, memory_mb)
        await self.store.add_e2b_build(E2BBuildRecord(
            build_id=build.build_id, tenant=tenant, alias=alias, cpu_count=cpu_count,
            memory_mb=memory_mb, created_at=build.created_at))
        await self.tag(tenant, alias, build.build_id, tags)
        return build

    async def build(self, tenant: str, alias: str, build_id: str) -> Build:
        found = await self.store.e2b_build(tenant, build_id)
        if found is None or found.alias != alias:
            raise E2BError(404, f"build {build_id} of template {alias!r} not found")
        return _of(found)

    async def started(self, build: Build, core: str, translation: Translation) -> None:
        """Record that ``build`` started as replgate's build ``core``."""
        await self.store.start_e2b_build(build.build_id, core, translation.steps)
        build.core, build.translation = core, translation

    async def asked(self, tenant: str, alias: str) -> bool:
        """Whether a build of ``alias`` was asked (it may not have started yet)."""
        return bool(await self.store.e2b_builds_of(tenant, alias))

    async def builds_of(self, tenant: str, alias: str) -> list[Build]:
        return [_of(found) for found in await self.store.e2b_builds_of(tenant, alias)]

    async def forget(self, tenant: str, alias: str) -> None:
        await self.store.forget_e2b_template(tenant, alias)

    # -- tags ------------------------------------------------------------------------------

    async def tag(self, tenant: str, alias: str, build_id: str, tags: list[str]) -> None:
        await self.store.set_e2b_tags(tenant, alias, build_id, [check_tag(t) for t in tags],
                                      datetime.now(UTC))

    async def tags(self, tenant: str, alias: str) -> dict[str, Tag]:
        return {tag: Tag(build_id, at)
                for tag, (build_id, at) in (await self.store.e2b_tags(tenant, alias)).items()}

    async def untag(self, tenant: str, alias: str, tags: list[str]) -> None:
        held = await self.store.e2b_tags(tenant, alias)
        missing = [tag for tag in tags if tag not in held]
        if missing:
            raise E2BError(404, f"template {alias!r} has no tag {', '.join(missing)}")
        await self.store.remove_e2b_tags(tenant, alias, tags)

    async def tagged(self, tenant: str, alias: str, tag: str | None) -> str:
        """The build id ``alias:tag`` names (no tag: the latest build asked)."""
        if tag is None:
            builds = await self.store.e2b_builds_of(tenant, alias)
            if not builds:
                raise E2BError(404, f"template {alias!r} not found")
            return builds[-1].build_id
        found = (await self.store.e2b_tags(tenant, alias)).get(tag)
        if found is None:
            raise E2BError(404, f"template {alias!r} has no tag {tag!r}")
        return found[0]


def _of(found: E2BBuildRecord) -> Build:
    return Build(found.tenant, found.alias, found.build_id, found.cpu_count, found.memory_mb,
                 found.created_at, found.core,
                 None if found.steps is None else Translation(steps=found.steps))


def core_templates(request: Request) -> Templates:
    templates: Templates | None = getattr(request.app.state, "templates", None)
    if templates is None:
        raise E2BError(503, "this gateway builds no templates (it was started without them)")
    return templates


def builds_of_app(request: Request) -> TemplateBuilds:
    builds: TemplateBuilds = request.app.state.e2b_templates
    return builds


async def custom_template(request: Request, tenant: str, template: str) -> TemplateInfo | None:
    """The tenant's (or a published) replgate template E2B's ``template`` (``alias`` or
    ``alias:tag``) names, ready; None when it names none (a profile's name, or a default
    template). E2B's 400 when it is not ready."""
    alias = template.partition(":")[0]
    templates: Templates | None = getattr(request.app.state, "templates", None)
    if templates is None or alias in DEFAULT_TEMPLATES or not _NAME.fullmatch(alias):
        return None
    try:
        info: TemplateInfo = await templates.get(tenant, alias)
    except NotFound:  # then it may be a profile's name
        return None
    if info.status is not TemplateStatus.READY:
        raise E2BError(400, f"template {alias!r} is not ready: its build is {info.status.value}"
                            + (f" ({info.error})" if info.error else ""))
    return info
