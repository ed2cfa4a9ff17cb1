"""A Docker sandbox's state and shared steps, and what it needs of its backend
(:class:`SandboxEngine`): the ground :class:`~._sandbox.DockerSandbox` is built on."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any, Protocol

import docker
import docker.errors

from kernel_pool._workspace import Workspace
from kernel_pool.backends.base import Sandbox, SandboxInfo
from kernel_pool.backends.docker._boot_id import (
    bind_boot_id,
    new_boot_id,
    offered,
    write_boot_id,
)
from kernel_pool.backends.docker._cgroup import CgroupReader
from kernel_pool.backends.docker._context import DockerContextSandbox
from kernel_pool.backends.docker._docker import call_engine, in_thread
from kernel_pool.backends.docker._freezer import Freezer
from kernel_pool.backends.docker._gvisor import OutOfMemoryWatch, Runsc
from kernel_pool.backends.docker._init_kernel import find_kernel
from kernel_pool.backends.docker._strays import end_init, process_alive
from kernel_pool.backends.docker._template import Template
from kernel_pool.config import Profile
from kernel_pool.exceptions import BackendError

logger = logging.getLogger(__name__)

ENGINE_EXIT_WAIT_S = 10.0
"""How long a removal waits for the engine to see a container it ended exit (measured: about
half a second for a gVisor sandbox, a fork bomb in it or not; tens of milliseconds under
runc)."""


class SandboxEngine(Protocol):
    """What a sandbox uses of its backend (a :class:`~kernel_pool.backends.docker.DockerBackend`,
    which makes the sandboxes)."""

    client: docker.DockerClient
    template_work: Path
    """CRIU's work folders of the restores under way, one per sandbox."""
    file_locks: bool
    tree_checkpoints: bool
    data_root: Path

    def run_container(self, sandbox_id: str, profile: Profile, workspace: Path,
                      socket_dir: Path, env: dict[str, str], boot_id: str | None = None) -> str:
        """Start the hardened container (blocking), showing ``boot_id`` if given."""

    def remove_container(self, container_id: str) -> None:
        """Remove a container (blocking)."""

    @staticmethod
    def make_socket_dir(path: Path) -> None:
        """Make a sandbox's socket folder (blocking)."""

    @staticmethod
    def unmount_socket_dir(path: Path) -> None:
        """Unmount a stopped sandbox's socket folder (blocking)."""

    async def remove(self, info: SandboxInfo, workspace: Workspace | None = None) -> None:
        """Remove a sandbox: its container and folders."""

    def template_for(self, profile: Profile) -> Template | None:
        """The template a new kernel of ``profile`` may be restored from, if one is ready."""

    async def drop_template(self, profile: Profile, template: Template) -> None:
        """Forget a template a restore failed from."""


class DockerSandboxBase(Sandbox):
    """A Docker sandbox's state, and what its launch, checkpoint and process watch share:
    its container's PID 1 and cgroup found, the kernel's pidfd."""

    def __init__(self, backend: SandboxEngine, info: SandboxInfo, profile: Profile,
                 workspace: Workspace, env: dict[str, str]) -> None:
        self._backend = backend
        self.info = info
        self.profile = profile
        self.workspace = workspace
        self._env = env
        self._pid: int | None = None
        self._pidfd: int | None = None
        self._cgroup: CgroupReader | None = None
        self._runsc: Runsc | None = None
        """Under gVisor: the sandbox's processes are reached through runsc, not the cgroup."""
        self._freezer: Freezer | None = None
        """Under runc: stops every process of the container while strays are killed."""
        self._warm_frozen = False
        """Frozen by :meth:`freeze_warm` (a warm kernel waiting to be claimed)."""
        self._oom_watch: OutOfMemoryWatch | None = None
        """Under gVisor: the running kernel's watch for a stuck out-of-memory kill."""
        self._sandbox_oom_kills: int | None = None
        """Under gVisor: the OOM count as last seen when the kernel ended (its sandbox's cgroup
        may be gone since: the sandbox died with it)."""
        self._init_pid = 0
        """The host pid of the container's PID 1 (the reaper)."""
        self._exit_code: int | None = None
        self._commands: set[int] = set()
        """Host pids of the shell commands' wrappers running now."""
        self.context_pids: set[int] = set()
        self._service: dict[int, int] = {}
        """The profile's service (``start_cmd``) as the kernel's first answer found it: the
        kernel's children leading sessions of their own, pid: start time (host pids; gVisor's
        own, start time 0, under gVisor). Spared, with their descendants, by kill_strays."""
        """Host pids of the code contexts' kernels running now (:meth:`add_kernel`)."""
        self._context_faces: dict[str, DockerContextSandbox] = {}
        """The code contexts' faces by name (:meth:`add_kernel`): a checkpoint records those
        whose kernels run."""
        self._restored_contexts: dict[str, tuple[str, int, dict[str, Any]]] = {}
        """After a restore from a memory image: the contexts' kernels it held, by context
        name, as (kernel name, host pid, connection), until a face adopts each."""
        self._launching = asyncio.Lock()
        """Held from a launch request to PID 1's record of it (PID 1 reads one request)."""
        self.fresh = False
        """Whether the container was made (or remade) and no kernel has run in it yet: its
        first kernel may come from a template."""
        self.from_template = False
        """Whether the running kernel was restored from a template (not booted)."""
        self._kept_boot: str | None = None
        """The boot id the next start keeps (:meth:`resume_boot`), rather than a new one."""
        self.memory_path: str | None = None
        """How the last memory pause dumped, or resume restored, the sandbox: ``"kernel
        tree"`` (CRIU inside the container, :mod:`._tree`) or ``"engine"`` (the whole
        container, runc's dump and the engine's ``start --checkpoint``)."""
        self._tree_dumped = False
        """A memory pause dumped the kernel's tree and left it stopped in its running
        container, which :meth:`end_dumped_tree` ends."""

    @property
    def _api(self) -> docker.APIClient:
        return self._backend.client.api

    @property
    def _socket_dir(self) -> Path:
        return Path(self.info.socket_dir)

    async def _running(self) -> bool:
        try:
            state = (await call_engine(self._api.inspect_container,
                                       self.info.container_id))["State"]
        except BackendError:
            return False
        # A container being removed (someone's `docker rm -f`) still says Running, and so does
        # one whose init was just killed until the engine reaps it: ask the host's process table.
        return (bool(state.get("Running")) and state.get("Status") == "running"
                and process_alive(int(state.get("Pid") or 0)))

    async def _remove_container(self) -> None:
        """The engine's removal of the container, once its processes were ended from the
        host (see :meth:`_end_before_removal`)."""
        await self._end_before_removal()
        await call_engine(self._backend.remove_container, self.info.container_id)

    async def _end_before_removal(self) -> None:
        """Before a removal: end the container from the host, then wait until the engine has
        seen it exit, so that the removal has nothing left to stop.

        Under runc, SIGKILL to its PID 1 (:func:`~._strays.end_init`): the engine's own stop
        is a ``runc kill``, one more start of a Go program per removal; ended from here, a
        removal cost the engine 32 ms of CPU against 50 (twenty at a time). Under gVisor,
        :meth:`Runsc.end_sandbox`: the engine's stop goes through the sandbox, which a sandbox
        swamped by a fork bomb answers late or never.

        The wait matters: a removal asked for while the engine's runtime shim is still taking
        in the exit made the shim deadlock (containerd 1.6's: the exit waits for the lock its
        kill holds, the kill for the exit to be reaped) until a timeout 85-190 s later; once
        the engine says the container stopped, its removal has nothing to kill."""
        if self.profile.runtime == "gvisor":
            ended = self._runsc is not None and self._runsc.end_sandbox()
        else:
            ended = end_init(self._init_pid, self.info.container_id, self._freezer)
        if not ended:
            return
        deadline = asyncio.get_running_loop().time() + ENGINE_EXIT_WAIT_S
        while asyncio.get_running_loop().time() < deadline:
            try:
                state = (await call_engine(self._api.inspect_container,
                                           self.info.container_id))["State"]
            except BackendError:
                return  # gone already
            if not state.get("Running"):
                return
            await asyncio.sleep(0.02)
        logger.warning("sandbox %s: the engine still says it runs %g s after its PID 1 was "
                       "killed; removing it anyway", self.info.sandbox_id, ENGINE_EXIT_WAIT_S)

    async def _ensure_running(self) -> None:
        if not await self._running():
            await call_engine(self._backend.remove_container, self.info.container_id)
            boot = self._next_boot()
            self.info.container_id = await call_engine(
                self._backend.run_container, self.info.sandbox_id, self.profile,
                self.workspace.root, self._socket_dir, self._env, boot)
            self.boot_id = boot
            self._cgroup = None
            self.fresh = True
        if self._cgroup is None:
            await self._find_init()

    def _next_boot(self) -> str | None:
        """The boot id of the container about to start: the one a resume keeps, else new
        (None where sandboxes get none of their own)."""
        kept, self._kept_boot = self._kept_boot, None
        return (kept or new_boot_id()) if offered(self.profile.runtime) else None

    async def resume_boot(self, boot_id: str) -> None:
        if not offered(self.profile.runtime):
            return
        self.boot_id = boot_id
        if self._pidfd is not None:
            # Its kernel runs (a warm kernel's, the session's now): shown at once.
            await in_thread(write_boot_id, self._socket_dir, boot_id)
        else:  # stopped (paused), or its container going: the next start shows it
            self._kept_boot = boot_id

    async def _new_boot(self) -> None:
        """A boot in the running container (its kernel restarted, every process ended): a
        new boot id, shown at once."""
        if self.boot_id is not None:
            self.boot_id = new_boot_id()
            await in_thread(write_boot_id, self._socket_dir, self.boot_id)

    async def _find_init(self) -> None:
        """The host pid of the (new or restored) container's PID 1, and its cgroup."""
        state = (await call_engine(self._api.inspect_container, self.info.container_id))["State"]
        self._init_pid = int(state.get("Pid") or 0)
        self._cgroup = CgroupReader.for_pid(self._init_pid)
        gvisor = self.profile.runtime == "gvisor"
        self._runsc = Runsc.for_sandbox(self._init_pid, self.info.container_id) if gvisor else None
        # Under gVisor the cgroup holds the sentry, whose freeze would stop the whole sandbox.
        self._freezer = (None if gvisor
                         else Freezer.for_pid(self._init_pid, self.info.container_id))
        if self.boot_id is not None:
            await in_thread(self._show_boot_id, self._init_pid)

    def _show_boot_id(self, init_pid: int) -> None:
        """Show the sandbox's boot id in its (just started) container, whose PID 1 is host
        pid ``init_pid``, before any kernel or command runs there (blocking). One that cannot
        be bound (a container an older gateway made without its mount) shows its host's:
        said in the log, not an error."""
        try:
            bind_boot_id(init_pid, self.info.container_id)
        except OSError as exc:
            logger.warning("sandbox %s: its boot id could not be bound (%s); it shows its "
                           "host's", self.info.sandbox_id, exc)

    @property
    def _through_init(self) -> bool:
        """Under runc the kernel is PID 1's child (a checkpoint holds it); under gVisor,
        whose sandboxes are never checkpointed here, it is started by ``docker exec``."""
        return self.profile.runtime != "gvisor"

    async def _watch_init_child(self, name: str, wait_s: float) -> None:
        """Find the kernel PID 1 started (its host pid, and a pidfd for its exit)."""
        found = await in_thread(find_kernel, self._socket_dir, name, self._init_pid, wait_s)
        self._keep_init_child(*found)

    def _keep_init_child(self, pid: int | None, code: int | None) -> None:
        """Keep the kernel found (``pid``), or the exit code of one that did not start."""
        if pid is None:
            self.info.kernel_ref = None
            self._exit_code = code if code is not None else -1
            return
        self.info.kernel_ref = str(pid)
        self._open_pidfd(pid)

    def _open_pidfd(self, pid: int) -> None:
        self._pid = pid
        try:
            self._pidfd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            self._pidfd = None

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
