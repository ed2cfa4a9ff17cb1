"""The Docker backend's kernel templates: which one a new kernel starts from, and making it."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import shutil
from functools import partial

from kernel_pool.backends.base import Sandbox, SandboxSpec
from kernel_pool.backends.docker._containers import DockerContainers
from kernel_pool.backends.docker._docker import in_thread, to_its_end
from kernel_pool.backends.docker._init_kernel import container_pid
from kernel_pool.backends.docker._sandbox import DockerSandbox
from kernel_pool.backends.docker._template import (
    TEMPLATE_PID,
    Template,
    TemplateError,
    answered,
    first_pid,
    remove_stale_parts,
)
from kernel_pool.backends.docker._template import dump as dump_template
from kernel_pool.backends.docker._template import find as find_template
from kernel_pool.backends.docker._template import remove_others as remove_other_templates
from kernel_pool.backends.docker._tree import save_files
from kernel_pool.config import PoolSettings, Profile

logger = logging.getLogger(__name__)

TEMPLATE_ATTEMPTS = 2
"""Templates made per profile in a gateway's life, when restores from them fail."""


class DockerTemplates(DockerContainers):
    """Kernel templates per profile (a kernel booted once and checkpointed, see
    :mod:`._template`): made in the background on first need, dropped when a restore
    from one fails."""

    def __init__(self, settings: PoolSettings) -> None:
        super().__init__(settings)
        self._template_root = settings.template_dir or settings.state_dir / "templates"
        self.template_work = settings.state_dir / "template-work"
        """CRIU's work folders of the restores under way, one per sandbox."""
        self._templates: dict[str, Template] = {}
        self._template_tasks: dict[str, asyncio.Task[None]] = {}
        self._template_failures: dict[str, int] = {}

    templates = False
    """Whether kernels may start from templates here (see :mod:`._template`), once
    :meth:`check` found CRIU able to run and the setting asks for them."""
    templates_refusal: str | None = "the host was not checked for CRIU (the pool's start does)"

    def template_for(self, profile: Profile) -> Template | None:
        """The template a new kernel of ``profile`` may be restored from, if one is ready;
        the first call for an eligible profile starts making it (in the background: kernels
        boot meanwhile)."""
        # (A profile's egress_allow is no reason to boot: its proxy is served beside the
        # sandbox and its variables set in the restored kernel, as a session's policy is.)
        if not self.templates or profile.runtime != "runc":
            return None  # gVisor is not checkpointed with CRIU
        ready = self._templates.get(profile.name)
        if ready is not None or profile.name in self._template_tasks:
            return ready
        if self._template_failures.get(profile.name, 0) >= TEMPLATE_ATTEMPTS:
            return None
        self._template_tasks[profile.name] = asyncio.create_task(
            self._make_template(profile), name=f"template {profile.name}")
        return None

    async def drop_template(self, profile: Profile, template: Template) -> None:
        """Forget (and remove) a template a restore failed from; another is made later, up to
        :data:`TEMPLATE_ATTEMPTS` in all."""
        if self._templates.get(profile.name) is template:
            del self._templates[profile.name]
            del self._template_tasks[profile.name]
            self._template_failures[profile.name] = (
                self._template_failures.get(profile.name, 0) + 1)
            await in_thread(shutil.rmtree, template.folder, True)

    async def _make_template(self, profile: Profile) -> None:
        try:
            image = await self.image_digest(profile.image) or profile.image
            fingerprint = hashlib.sha256(
                f"{image}\n{profile.model_dump_json()}".encode()).hexdigest()[:16]
            stem = f"{profile.name}-{fingerprint}"
            template = await in_thread(find_template, self._template_root, stem)
            if template is None:
                await in_thread(remove_stale_parts, self._template_root)
                template = await self._dump_template(profile, stem)
                logger.info("kernel template for profile %s made: new kernels are restored "
                            "from it", profile.name)
            if self.settings.template_dir is None:  # the state directory's own: no one shares
                await in_thread(remove_other_templates, self._template_root, profile.name,
                                template.folder)
            self._templates[profile.name] = template
        except Exception as exc:  # a template only saves time: never fatal
            self._template_failures[profile.name] = (
                self._template_failures.get(profile.name, 0) + 1)
            del self._template_tasks[profile.name]
            logger.warning("no kernel template for profile %s (%s): its kernels boot",
                           profile.name, exc)

    async def _dump_template(self, profile: Profile, stem: str) -> Template:
        """Boot a kernel in a sandbox of its own, wait for its answer (its imports done), and
        dump it into a new folder ``stem-*``; the sandbox is removed either way."""
        await in_thread(partial(self._template_root.mkdir, mode=0o700, parents=True,
                                exist_ok=True))
        # Its workspace is never written: the smallest one, not the profile's (a full
        # reservation of the state directory's disk, for a moment).
        spec = SandboxSpec(sandbox_id=f"template-{secrets.token_hex(6)}",
                           profile=profile.model_copy(update={"workspace_size": "16m"}))
        # Made to its end even when the pool closes meanwhile (the template task cancelled):
        # a sandbox left half-made would keep its mounts.
        creating = asyncio.ensure_future(self.create(spec))
        try:
            sandbox = await asyncio.shield(creating)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await self._remove_sandbox(await creating)
            raise
        assert isinstance(sandbox, DockerSandbox)
        try:
            await sandbox._find_init()
            await in_thread(first_pid, sandbox._init_pid, sandbox.info.container_id,
                            TEMPLATE_PID)
            sandbox.fresh = False
            connection = await sandbox.launch_kernel()
            await answered(sandbox, connection,
                           profile.start_timeout(self.settings.kernel_start_timeout_s))
            pid = container_pid(sandbox._pid) if sandbox._pid else None
            if pid is None:
                raise TemplateError("the template's kernel is gone")
            init, container = sandbox._init_pid, sandbox.info.container_id
            # What a service wrote in /tmp as it started is its sandboxes' too (E2B's
            # snapshot holds it); a kernel alone has only its own folders there.
            keep = (partial(save_files, init, container)
                    if profile.start_cmd or profile.ready_cmd else None)
            return await in_thread(dump_template, init, container, pid, self._template_root,
                                   stem, sandbox.info.kernel_name or "",
                                   str(connection["key"]), keep)
        finally:
            # a close of the pool cancels this task at any point, its clean-up included
            await to_its_end(self._remove_sandbox(sandbox))

    @staticmethod
    async def _remove_sandbox(sandbox: Sandbox) -> None:
        """Remove a template's sandbox: its container, then its workspace and mounts."""
        try:
            await sandbox.kill()
        finally:
            await sandbox.cleanup()
