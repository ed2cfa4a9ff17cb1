"""The Docker backend: one hardened container per sandbox, kernels reached over ZMQ ipc.

The container has no network at all; the kernel's ZMQ sockets are Unix sockets in a folder
bind-mounted from the host (``/kernel``). Every blocking Docker SDK call runs in a worker
thread (``anyio.to_thread``), never on the event loop. Containers carry labels naming the
owning gateway and sandbox, so a restarted gateway finds, re-adopts or removes them.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from kernel_pool._host_memory import memory_available as host_memory_available
from kernel_pool._workspace import Workspace
from kernel_pool.backends.base import Sandbox, SandboxInfo, SandboxSpec
from kernel_pool.backends.docker._boot_id import new_boot_id, offered, read_boot_id
from kernel_pool.backends.docker._checkpoint import CONTAINERD_STAGING, remove_staged_copies
from kernel_pool.backends.docker._criu import checkpoint_support, dumps_file_locks
from kernel_pool.backends.docker._docker import (
    DATA_ROOT,
    SOCKET_SUBDIR,
    call_engine,
    container_name,
    in_thread,
)
from kernel_pool.backends.docker._freezer import Freezer
from kernel_pool.backends.docker._gvisor import missing_runtime
from kernel_pool.backends.docker._init_kernel import latest_kernel
from kernel_pool.backends.docker._kdat import NAME as KDAT_NAME
from kernel_pool.backends.docker._kdat import make_cache as make_kdat_cache
from kernel_pool.backends.docker._sandbox import DockerSandbox
from kernel_pool.backends.docker._template import refusal as templates_refusal
from kernel_pool.backends.docker._templates import DockerTemplates
from kernel_pool.config import Profile, parse_size
from kernel_pool.exceptions import BackendError, WorkspaceError

logger = logging.getLogger(__name__)


class DockerBackend(DockerTemplates):
    """Sandboxes as Docker containers on the local engine (``DOCKER_HOST`` is honoured)."""

    name = "docker"
    stopped_sandboxes = True
    checkpoints = False
    checkpoint_refusal: str | None = "the host was not checked for CRIU (the pool's start does)"
    file_locks = False
    """Whether runc's CRIU keeps file locks (:func:`._criu.dumps_file_locks`)."""
    tree_checkpoints = False
    """Whether memory pauses may dump the kernel's tree from inside its container (see
    :mod:`._tree`): where CRIU's private root lets it run there, as for templates."""
    data_root = Path(DATA_ROOT)
    """The engine's data root, from ``docker info`` at :meth:`check` (an engine cannot change it
    without a restart; asking again would add 10-50 ms to every pause and resume)."""

    def memory_available(self) -> int | None:
        """The host's MemAvailable: its containers are this host's (their kernels' sockets are
        bind-mounted from here, whatever ``DOCKER_HOST`` says)."""
        return host_memory_available()

    async def create(self, spec: SandboxSpec) -> Sandbox:
        return await self._create(spec, start=True)

    async def create_stopped(self, spec: SandboxSpec) -> Sandbox:
        """The workspace and socket folder alone; ``launch_kernel`` makes the container (under
        the name it is given here) as it does for a paused session's sandbox."""
        return await self._create(spec, start=False)

    async def _create(self, spec: SandboxSpec, start: bool) -> Sandbox:
        socket_dir = self._run_dir / spec.sandbox_id / SOCKET_SUBDIR
        workspace_dir = self._workspaces / spec.sandbox_id
        if len(str(socket_dir)) > 90:
            raise BackendError(
                f"state dir path too long for Unix sockets ({socket_dir}); "
                "set REPLGATE_STATE_DIR to a shorter path")
        try:
            if start:  # a stopped sandbox's is made when it starts (``reserve``)
                await in_thread(self.make_socket_dir, socket_dir)
            try:
                workspace = await in_thread(
                    Workspace.create, workspace_dir, parse_size(spec.profile.workspace_size))
            except WorkspaceError as exc:  # no room on the host: the engine side's failure
                raise BackendError(f"cannot make the sandbox's workspace: {exc}") from exc
            container_id = container_name(spec.sandbox_id)
            boot = new_boot_id() if start and offered(spec.profile.runtime) else None
            if start:
                container_id = await call_engine(self.run_container, spec.sandbox_id, spec.profile,
                                                 workspace.root, socket_dir, spec.env, boot)
        except BaseException:
            # Failed or cancelled half-way: remove whatever was made (the container by name).
            await in_thread(self._discard, spec.sandbox_id, workspace_dir, socket_dir)
            raise
        info = SandboxInfo(sandbox_id=spec.sandbox_id, backend=self.name,
                           profile=spec.profile.name, container_id=container_id,
                           workspace=str(workspace.root), socket_dir=str(socket_dir))
        sandbox = DockerSandbox(self, info, spec.profile, workspace, spec.env)
        sandbox.fresh = start
        sandbox.boot_id = boot
        sandbox.languages = await self.image_languages(spec.profile.image)
        return sandbox

    async def load(self, info: SandboxInfo, profile: Profile) -> Sandbox:
        """Take back a running sandbox: its container, workspace and running kernel, if any."""
        workspace = Workspace(Path(info.workspace), Path(info.workspace).with_suffix(".ext4"))
        details = await call_engine(self.client.api.inspect_container, info.container_id)
        env = dict(item.split("=", 1) for item in details["Config"].get("Env") or []
                   if "=" in item)
        sandbox = DockerSandbox(self, info, profile, workspace, env)
        sandbox.languages = await self.image_languages(profile.image)
        if offered(profile.runtime):
            sandbox.boot_id = await in_thread(read_boot_id, Path(info.socket_dir))
        info.kernel_name, info.kernel_ref = None, None
        if sandbox._through_init:
            state = details.get("State") or {}
            init_pid = int(state.get("Pid") or 0) if state.get("Running") else 0
            freezer = Freezer.for_pid(init_pid, info.container_id) if init_pid else None
            if freezer is not None and not state.get("Paused"):
                # A gateway killed while it reaped strays left the freeze (the engine's own
                # pause would say Paused): nothing in the container would run again.
                await in_thread(freezer.thaw)
            name = await in_thread(latest_kernel, Path(info.socket_dir)) if init_pid else None
            if name is not None:
                sandbox._init_pid, info.kernel_name = init_pid, name
                await sandbox._watch_init_child(name, 0.0)
                if info.kernel_ref is not None:
                    await sandbox._ensure_running()
                else:
                    info.kernel_name = None
            return sandbox
        for exec_id in details.get("ExecIDs") or []:
            exec_details = await call_engine(self.client.api.exec_inspect, exec_id)
            arguments = exec_details.get("ProcessConfig", {}).get("arguments") or []
            if exec_details.get("Running") and "replgate_kernel" in arguments:
                info.kernel_ref = exec_id
                info.kernel_name = Path(arguments[-1]).stem
        if info.kernel_ref:
            await sandbox._ensure_running()
            await sandbox._watch(info.kernel_ref)
        return sandbox

    async def check(self, profiles: list[Profile]) -> None:
        """Fail when a profile asks for a runtime the engine does not offer as needed; learn
        whether memory pauses and kernel templates can work here (when they are asked for)."""
        info = await call_engine(self.client.api.info)
        self.data_root = Path(info.get("DockerRootDir") or DATA_ROOT)
        problem = missing_runtime(info.get("Runtimes") or {}, profiles)
        if problem:
            raise BackendError(problem)
        pauses = self.settings.pause_with != "variables"
        if not (pauses or self.settings.kernel_templates):
            return
        support = await in_thread(checkpoint_support, info)
        if self.settings.kernel_templates:
            self.templates_refusal = templates_refusal(support)
            self.templates = self.templates_refusal is None
            if not self.templates:
                logger.info("kernels boot: no kernel templates here (%s)", self.templates_refusal)
        if pauses:
            self.checkpoints = support.available and os.geteuid() == 0
            self.tree_checkpoints = self.checkpoints and templates_refusal(support) is None
            self.checkpoint_refusal = (
                None if self.checkpoints else support.reason if not support.available
                else "the gateway is not root, and cannot reach the engine's checkpoints")
            self.file_locks = self.checkpoints and await in_thread(dumps_file_locks)
            if self.checkpoint_refusal:
                # Asked for by name, it is worth a warning; `auto` makes do with variables.
                logger.log(logging.WARNING if self.settings.pause_with == "memory" else
                           logging.INFO, "REPLGATE_PAUSE_WITH=%s, but memory pauses are not "
                           "available (%s): pauses keep the variables",
                           self.settings.pause_with, self.checkpoint_refusal)
            else:
                removed = await in_thread(remove_staged_copies)
                if removed:
                    logger.info("removed %d copies of restored memory images containerd "
                                "left in %s", removed, CONTAINERD_STAGING)
        if self.templates or self.tree_checkpoints:  # CRIU runs inside sandboxes
            self.kdat_cache = await in_thread(make_kdat_cache,
                                              self.settings.state_dir / KDAT_NAME)

    async def load_stopped(self, info: SandboxInfo, profile: Profile,
                           env: dict[str, str]) -> Sandbox:
        """A paused session's sandbox, released (its workspace parked, no mount); its
        ``launch_kernel`` (after ``reserve``) makes its container."""
        await in_thread(self.unmount_socket_dir, Path(info.socket_dir))
        try:
            workspace = await in_thread(Workspace.take_back_parked, Path(info.workspace),
                                        parse_size(profile.workspace_size))
        except WorkspaceError as exc:
            raise BackendError(f"cannot take back the sandbox's workspace: {exc}") from exc
        stopped = info.model_copy(update={"kernel_name": None, "kernel_ref": None})
        sandbox = DockerSandbox(self, stopped, profile, workspace, env)
        sandbox.languages = await self.image_languages(profile.image)
        return sandbox

    async def close(self) -> None:
        tasks = list(self._template_tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await in_thread(self.client.close)
