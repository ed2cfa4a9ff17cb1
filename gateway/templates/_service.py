"""Custom templates, the use cases: a tenant's build started, followed, listed and deleted; a
ready template made a profile of the host, which its tenant's sessions name.

A build runs on the engine in a task of this gateway (:func:`gateway.doctor.build_template_image`:
the user's Dockerfile, then replgate's sandbox layer), then a real session of the new profile
checks that a kernel starts (:func:`check_kernel`); only then is the template ready. The
database keeps each template and build (:mod:`gateway.records.templates`); the log of a build
under way is this gateway's (:class:`BuildRun`), written to the database when it ends.

Each build has its own profile, ``<template id>-<build number>``: a rebuild's kernels (warm, or
restored from its kernel template) never mix with the last build's. A profile keeps one warm
kernel for ``REPLGATE_TEMPLATE_WARM_S`` after a session of it is created, else none.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import secrets
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from datetime import UTC, datetime

from common.errors import Conflict, Forbidden, InvalidInput, NotFound, TooManyRequests
from gateway.doctor import (
    TemplateBuild,
    build_template_image,
    check_context,
    export_image,
    image_key,
    remove_template_image,
)
from gateway.service import Gateway
from gateway.templates._models import ID_PREFIX, BuildSpec
from gateway.templates._profiles import ResolvedProfiles
from gateway.templates._runs import BuildRun, check_kernel
from gateway.wire import LogLine, TemplateInfo, TemplateStatus
from kernel_pool import (
    BundleStore,
    BundleStoreError,
    ImageError,
    KernelPoolError,
    TemplateBuildFailed,
    parse_size,
)

logger = logging.getLogger(__name__)

IMAGE_REPOSITORY = "replgate-template"
REMOVE_WITHIN_S = 3600.0
"""How long a deleted template's images are tried again while sessions run on them (a purge
removes what is left)."""
REMOVE_RETRY_S = 2.0


def _now() -> datetime:
    return datetime.now(UTC)


class Templates(ResolvedProfiles):
    """The tenants' custom templates: their builds on the engine, their records, their
    profiles on the host."""

    def __init__(self, gateway: Gateway, *, images: BundleStore | None = None) -> None:
        self.gateway = gateway
        self.images = images
        """Where each build's image is saved (the bundle store, if any), for the nodes and the
        gateways on other machines."""
        self.store = gateway.store
        self.host = gateway.pool
        self.settings = gateway.settings
        self._runs: dict[str, BuildRun] = {}
        """The latest build of each template built by this gateway since it started."""
        self._building: Counter[str] = Counter()
        """Builds under way per tenant (``REPLGATE_MAX_TEMPLATE_BUILDS_PER_TENANT``)."""
        self._starting: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._used: dict[str, float] = {}
        """When a session of each template profile was last created (the loop's clock)."""
        self._uncached: set[str] = set()
        """Templates whose next build skips the cache (a purge since)."""
        self._warm_task: asyncio.Task[None] | None = None
        self._resolved: dict[tuple[str, str], tuple[str, float]] = {}
        """(tenant, name asked) -> (profile, when resolved), forgotten at each change of a
        template here and after ``RESOLVED_FOR_S`` (another gateway's change), so a create is
        a dictionary lookup, as for any profile, most of the time."""
        self._removing: set[asyncio.Task[None]] = set()
        """Deleted templates' images waiting for their last container to go."""
        gateway.templates = self

    def __repr__(self) -> str:
        return f"<Templates {sum(self._building.values())} building>"

    # -- the gateway's life ------------------------------------------------------------------

    async def open(self) -> None:
        """Make the ready templates' profiles again (a restarted gateway), end the builds a
        stopped one left as failed, and start shrinking unused profiles."""
        for build_id in await self.store.unfinished_builds():
            logger.warning("template build %s was under way when a gateway stopped", build_id)
        for info in await self.store.list_templates():
            if info.status is TemplateStatus.BUILDING and info.id not in self._runs:
                info = info.model_copy(update={
                    "status": TemplateStatus.FAILED, "updated_at": _now(),
                    "error": "the gateway stopped during the build; build it again"})
                await self.store.update_template(info)
            if info.image is not None and self.host.adds_profiles:
                self.host.set_profile(self._profile(
                    info.profile, info.image, 0, start_cmd=info.start_cmd,
                    ready_cmd=info.ready_cmd))
        self._warm_task = asyncio.create_task(self._shrink_loop(), name="template profiles")

    async def close(self) -> None:
        """End the builds under way (each recorded as failed) and the shrinking."""
        tasks = [run.task for run in self._runs.values() if run.task is not None]
        tasks += self._removing
        if self._warm_task is not None:
            tasks.append(self._warm_task)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    # -- builds ------------------------------------------------------------------------------

    async def start(self, tenant: str, spec: BuildSpec) -> TemplateInfo:
        """Start a build (a new template, or a rebuild of the tenant's template of that name)
        and return at once with status ``building``; TooManyRequests past the quotas."""
        if not self.host.adds_profiles:
            raise InvalidInput("custom templates on nodes need a bundle store "
                               "(REPLGATE_BUNDLE_STORE) that carries their images to the nodes")
        if spec.context:
            try:
                await asyncio.to_thread(check_context, spec.context)
            except ImageError as exc:
                raise InvalidInput(str(exc)) from exc
        async with self._starting[tenant]:
            if self._building[tenant] >= self.settings.max_template_builds_per_tenant:
                raise TooManyRequests(
                    f"tenant {tenant!r} has {self._building[tenant]} template builds under "
                    "way, the most at once; wait for one or raise "
                    "REPLGATE_MAX_TEMPLATE_BUILDS_PER_TENANT")
            now, build_id = _now(), "bld_" + secrets.token_hex(10)
            found = await self.store.find_template(tenant, spec.name)
            if found is not None and found.tenant == tenant and found.name == spec.name:
                if found.status is TemplateStatus.BUILDING:
                    raise Conflict(f"template {spec.name!r} has a build under way; wait for it")
                info = found.model_copy(update={
                    "status": TemplateStatus.BUILDING, "error": None, "failed_line": None,
                    "build_id": build_id, "builds": found.builds + 1, "updated_at": now,
                    "start_cmd": spec.start_cmd, "ready_cmd": spec.ready_cmd})
                await self.store.update_template(info)
            else:
                if await self.store.count_templates(tenant) >= \
                        self.settings.max_templates_per_tenant:
                    raise TooManyRequests(
                        f"tenant {tenant!r} has {self.settings.max_templates_per_tenant} "
                        "templates, the most it may keep; delete some or raise "
                        "REPLGATE_MAX_TEMPLATES_PER_TENANT")
                template_id = ID_PREFIX + secrets.token_hex(10)
                info = TemplateInfo(
                    id=template_id, name=spec.name, tenant=tenant,
                    status=TemplateStatus.BUILDING, created_at=now, updated_at=now,
                    build_id=build_id, builds=1, profile=f"{template_id}-1",
                    start_cmd=spec.start_cmd, ready_cmd=spec.ready_cmd)
                await self.store.add_template(info)
            await self.store.add_build(build_id, info, now)
            self._resolved.clear()
            run = self._runs[info.id] = BuildRun(build_id)
            self._building[tenant] += 1
            run.task = asyncio.create_task(self._build(info, spec, run),
                                           name=f"template build {build_id}")
        return info

    async def _build(self, info: TemplateInfo, spec: BuildSpec, run: BuildRun) -> None:
        ended = info
        try:
            ended = await self._built(info, spec, run)
        except TemplateBuildFailed as exc:
            ended = self._failed(info, exc.reason, exc.line)
        except (ImageError, KernelPoolError) as exc:
            ended = self._failed(info, str(exc), None)
        except asyncio.CancelledError:
            ended = self._failed(info, "the build was ended: its template was deleted, or the "
                                 "gateway stopped during the build", None)
            raise
        finally:
            if ended.error is not None:
                run.add(f"error: {ended.error}", error=True)
            self._building[info.tenant] -= 1
            try:
                if self._runs.get(info.id) is run:
                    await self.store.update_template(ended)
                    self._resolved.clear()  # after the write: a lookup meanwhile read the old
                await self.store.end_build(run.build_id, ended, run.lines, _now())
            finally:
                run.end()

    async def _built(self, info: TemplateInfo, spec: BuildSpec, run: BuildRun) -> TemplateInfo:
        tag = f"{IMAGE_REPOSITORY}:{info.id}-{info.builds}"
        nocache = spec.skip_cache or info.id in self._uncached
        self._uncached.discard(info.id)
        build = TemplateBuild(
            dockerfile=spec.dockerfile, tag=tag, nocache=nocache,
            step_timeout_s=spec.step_timeout_s or self.settings.template_step_timeout_s,
            labels={"io.replgate.template": info.id, "io.replgate.tenant": info.tenant})
        run.add(f"replgate: building {info.name} ({info.id}, build {info.builds})"
                + (" without the layer cache" if nocache else ""))
        built = await build_template_image(build, spec.context, run.add)
        most = parse_size(self.settings.max_template_image_bytes)
        if built.size > most:
            with contextlib.suppress(ImageError):
                await remove_template_image(tag)
            raise TemplateBuildFailed(
                f"the image takes {built.size} bytes, more than REPLGATE_MAX_TEMPLATE_IMAGE_BYTES "
                f"({self.settings.max_template_image_bytes})")
        if self.images is not None:  # before a node is asked for a session of it (the check)
            run.add("replgate: saving the image into the bundle store")
            await export_image(tag, self.images)
        profile = self._profile(f"{info.id}-{info.builds}", tag, 0, start_cmd=spec.start_cmd,
                                ready_cmd=spec.ready_cmd)
        self.host.set_profile(profile)
        try:
            await check_kernel(self.host, profile, tenant=info.tenant, log=run)
        except BaseException:
            self.host.remove_profile(profile.name)
            self._remove_later([tag])  # an image no kernel runs in is of no use
            raise
        run.add(f"replgate: template {info.name} is ready ({built.size} bytes; profile "
                f"{profile.name})")
        return info.model_copy(update={
            "status": TemplateStatus.READY, "image": tag, "image_size": built.size,
            "profile": profile.name, "languages": built.languages, "lacks": built.lacks,
            "updated_at": _now()})

    def _failed(self, info: TemplateInfo, error: str, line: int | None) -> TemplateInfo:
        return info.model_copy(update={"status": TemplateStatus.FAILED, "error": error,
                                       "failed_line": line, "updated_at": _now()})

    # -- reading -----------------------------------------------------------------------------

    async def get(self, tenant: str, id_or_name: str) -> TemplateInfo:
        """The tenant's template (or a published one) by id or name; NotFound otherwise."""
        info = await self.store.find_template(tenant, id_or_name)
        if info is None:
            raise NotFound(f"no template {id_or_name!r}; GET /v1/templates lists yours")
        return info

    async def list(self, tenant: str) -> list[TemplateInfo]:
        """The tenant's templates and the published ones, newest first."""
        return await self.store.list_templates(tenant)

    async def logs(self, tenant: str, id_or_name: str, *, offset: int = 0,
                   build_id: str | None = None) -> builtins.list[LogLine]:
        """The lines of a build's log from ``offset`` (default: the latest build)."""
        info = await self.get(tenant, id_or_name)
        wanted = build_id or info.build_id
        run = self._runs.get(info.id)
        if run is not None and run.build_id == wanted:
            return run.lines[offset:]
        lines = await self.store.build_log(wanted)
        if lines is None or not wanted.startswith("bld_"):
            raise NotFound(f"no build {wanted!r} of template {info.name!r}")
        return lines[offset:]

    async def follow(self, tenant: str, id_or_name: str, *,
                     offset: int = 0) -> AsyncIterator[LogLine]:
        """The latest build's lines from ``offset`` as they come, ending with the build."""
        info = await self.get(tenant, id_or_name)
        run = self._runs.get(info.id)
        if run is not None and run.build_id == info.build_id:
            async for line in run.follow(offset):
                yield line
            return
        for line in await self.logs(tenant, id_or_name, offset=offset):
            yield line

    async def wait(self, tenant: str, id_or_name: str, within_s: float) -> TemplateInfo:
        """The template once its latest build has ended (or as it is after ``within_s``)."""
        info = await self.get(tenant, id_or_name)
        run = self._runs.get(info.id)
        if run is not None and run.task is not None and not run.ended:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(run.task), within_s)
        return await self.get(tenant, info.id)

    # -- deleting, publishing, purging -------------------------------------------------------

    async def delete(self, tenant: str, id_or_name: str) -> None:
        """Forget the tenant's template and remove its images (a build under way is ended);
        sessions of it run on to their end."""
        info = await self.get(tenant, id_or_name)
        if info.tenant != tenant:
            raise Forbidden(f"template {info.name!r} is published by an operator; only its "
                            "tenant deletes it")
        run = self._runs.pop(info.id, None)
        if run is not None and run.task is not None and not run.ended:
            run.task.cancel()
            with contextlib.suppress(BaseException):
                await run.task
        await self.store.delete_template_record(info.id)
        self._resolved.clear()
        for number in range(1, info.builds + 1):
            self.host.remove_profile(f"{info.id}-{number}")
        self._remove_later([f"{IMAGE_REPOSITORY}:{info.id}-{number}"
                            for number in range(1, info.builds + 1)])

    def _remove_later(self, tags: builtins.list[str]) -> None:
        task = asyncio.create_task(self._remove_images(tags), name=f"removing {tags[0]}")
        self._removing.add(task)
        task.add_done_callback(self._removing.discard)

    async def _remove_images(self, tags: builtins.list[str]) -> None:
        """Remove a deleted template's images once nothing runs on them: its idle kernels and
        a kernel template being made go in the background, and sessions of it run on."""
        if self.images is not None:  # (the nodes keep what they loaded)
            for tag in tags:
                try:
                    await self.images.delete(image_key(tag))
                except BundleStoreError as exc:
                    logger.warning("image %s stays in the bundle store: %s", tag, exc)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REMOVE_WITHIN_S
        while tags and loop.time() < deadline:
            for tag in list(tags):
                try:
                    await remove_template_image(tag)
                    tags.remove(tag)
                except ImageError as exc:
                    if "No such image" in str(exc):
                        tags.remove(tag)
            if tags:
                await asyncio.sleep(REMOVE_RETRY_S)
        if tags:
            logger.info("images of a deleted template still in use, left: %s", ", ".join(tags))

    async def publish(self, template_id: str, public: bool) -> TemplateInfo:
        """An operator's: let every tenant start sessions of the template (or its own alone)."""
        info = await self.store.template_by_id(template_id)
        if info is None:
            raise NotFound(f"no template {template_id!r}")
        info = info.model_copy(update={"public": public, "updated_at": _now()})
        await self.store.update_template(info)
        self._resolved.clear()
        return info

    async def purge_cache(self, tenant: str | None = None) -> builtins.list[str]:
        """An operator's: remove the images of the templates' earlier builds (their cached
        layers go with them) and build each template's next build without the layer cache;
        the templates of ``tenant`` (None: all). The ids of the images removed."""
        removed = []
        for info in await self.store.list_templates(tenant):
            if tenant is not None and info.tenant != tenant:
                continue
            self._uncached.add(info.id)
            for number in range(1, info.builds):
                tag = f"{IMAGE_REPOSITORY}:{info.id}-{number}"
                with contextlib.suppress(ImageError):
                    await remove_template_image(tag)
                    removed.append(tag)
        return removed
