"""The Docker backend's containers: made hardened, labelled, found, removed; their folders
(workspace, socket folder) and images."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import threading
import time
from functools import partial
from pathlib import Path

import docker
import docker.errors
import requests.exceptions
from docker.types import Mount, Ulimit

from kernel_pool._disk import SANDBOX_GID, SANDBOX_UID, detach
from kernel_pool._languages import offered
from kernel_pool._workspace import SANDBOX_PATH, Workspace
from kernel_pool.backends.base import SandboxBackend, SandboxInfo
from kernel_pool.backends.docker._boot_id import IN_SANDBOX, host_file, write_boot_id
from kernel_pool.backends.docker._docker import (
    KERNEL_DIR,
    LABEL_OWNER,
    LABEL_PROFILE,
    LABEL_SANDBOX,
    SOCKET_SUBDIR,
    call_engine,
    container_name,
    in_thread,
)
from kernel_pool.backends.docker._gvisor import ENGINE_RUNTIMES, host_pids_limit
from kernel_pool.backends.docker._kdat import IN_SANDBOX as KDAT_IN_SANDBOX
from kernel_pool.config import PoolSettings, Profile, parse_size
from kernel_pool.exceptions import BackendError, WorkspaceError

logger = logging.getLogger(__name__)

REMOVAL_WAITS = 300
"""Tenths of a second to wait for a container's removal that is already in progress."""
SLOW_REMOVALS = 4
"""How many times a removal may outlast the engine client's timeout before it is given up:
under gVisor, a sandbox left with a hundred processes by a fork bomb can take the engine more
than a minute to stop, and the removal goes on after the client stops waiting."""
SANDBOX_CPU_SHARES = 512
"""Half the default CPU weight (CIS Docker Benchmark 5.11): where each container is a cgroup of
its own beside the gateway's (systemd's cgroup driver), busy sandboxes must not starve the
gateway that serves every session. Sandboxes stay equal among themselves."""
ENGINE_CALLS = 3
"""Containers made (created and started) or removed at once. The bound came from Docker
20.10's libnetwork, which deadlocked the whole engine on many endpoints (even ``none`` ones)
created or deleted at once (seen here: 50 sessions deleted together); sandboxes have no
endpoint since they are made with the engine's networking disabled, and the bound stays for
the CPU: the engine's calls beyond it only take turns on the cores. One at a time left the
engine idle half of each start (runc, the shim) and halved the rate a burst of creates gets
(this 2-core machine: 4.3 containers a second one at a time, 8.2 three at a time, no more with
eight)."""
SMALL_PAGES = "--small-pages"
"""The argument by which a runc container's PID 1 (``replgate_kernel/init.py``) turns huge
pages off for itself and so for every kernel it starts (a profile without ``huge_pages``).
An argument, not a variable: the sandbox's environment holds nothing of the host's (a
variable of PID 1 shows in ``/proc/1/environ``). Not given under gVisor, whose kernels start
by ``docker exec`` and are not restored by CRIU: its PID 1 starts as it did before."""
HOSTS = ("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
         "fe00::0\tip6-localnet\nff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\n"
         "ff02::2\tip6-allrouters\n")
"""A sandbox's ``/etc/hosts``, the engine's own for a container without a network. Containers
are made with networking disabled (``NetworkDisabled``), not only in the ``none`` network:
the engine then makes no network sandbox for them, whose namespace file and prestart hook
each re-ran the whole ``dockerd`` binary (a fifth of a burst's CPU here; a container's make
and start 101 ms against 174 ms). runc still gives the container a network namespace of its
own with loopback up, and the engine no ``/etc/hosts``: this one (read-only, shared by every
sandbox) keeps ``localhost`` resolving. ``/etc/resolv.conf`` is the image's, empty: no
name server, where the engine's copied the host's address in."""
SOCKET_DIR_TMPFS = "size=1m,nr_inodes=64,mode=0755,nosuid,nodev,noexec"
"""The file system of a sandbox's socket folder, as root: sockets and a connection file."""


def _mount(arguments: list[str]) -> None:
    result = subprocess.run(["mount", *arguments], capture_output=True, text=True)
    if result.returncode != 0:
        raise BackendError(f"mount {' '.join(arguments)} failed: {result.stderr.strip()}")


class DockerContainers(SandboxBackend):
    """The containers, folders and images of Docker sandboxes, on the local engine."""

    def __init__(self, settings: PoolSettings) -> None:
        super().__init__(settings)
        try:
            self.client = docker.from_env(max_pool_size=32)
        except docker.errors.DockerException as exc:
            raise BackendError(
                f"cannot reach the Docker engine ({exc}); start it (./run.sh serve does) "
                "or set DOCKER_HOST") from exc
        self._lifecycle = threading.BoundedSemaphore(ENGINE_CALLS)
        """At most :data:`ENGINE_CALLS` containers made or removed at once."""
        self._run_dir = settings.state_dir / "run"
        self._workspaces = settings.state_dir / "workspaces"
        self._hosts = settings.state_dir / "hosts"
        self._languages: dict[str, tuple[str, ...]] = {}
        self.kdat_cache: Path | None = None
        """CRIU's kernel-feature cache, which runc sandboxes get read-only (see
        :mod:`._kdat`; made at the pool's start where CRIU runs inside sandboxes)."""

    def _labels(self, sandbox_id: str, profile: Profile, workspace: Path,
                socket_dir: Path) -> dict[str, str]:
        return {LABEL_OWNER: self.settings.owner, LABEL_SANDBOX: sandbox_id,
                LABEL_PROFILE: profile.name, "io.replgate.workspace": str(workspace),
                "io.replgate.sockets": str(socket_dir)}

    def run_container(self, sandbox_id: str, profile: Profile, workspace: Path,
                      socket_dir: Path, env: dict[str, str], boot_id: str | None = None) -> str:
        """Start the hardened container (blocking; called in a worker thread); with
        ``boot_id``, the sandbox's own (:mod:`._boot_id`), mounted for it to show."""
        memory = parse_size(profile.memory)
        mounts = [Mount(SANDBOX_PATH, str(workspace), type="bind"),
                  Mount(KERNEL_DIR, str(socket_dir), type="bind"),
                  Mount("/etc/hosts", str(self._hosts_file()), type="bind", read_only=True)]
        if boot_id is not None:
            write_boot_id(socket_dir, boot_id)
            mounts.append(Mount(IN_SANDBOX, str(host_file(socket_dir)), type="bind",
                                read_only=True))
        kdat = self.kdat_cache
        if kdat is not None and profile.runtime != "gvisor" and kdat.is_file():
            mounts.append(Mount(KDAT_IN_SANDBOX, str(kdat), type="bind", read_only=True))
        with self._lifecycle:
            return self._run_container(sandbox_id, profile, workspace, socket_dir, env, memory,
                                       mounts)

    def _hosts_file(self) -> Path:
        """The sandboxes' ``/etc/hosts`` (:data:`HOSTS`), written when missing or changed
        (blocking)."""
        with contextlib.suppress(OSError):
            if self._hosts.read_text() == HOSTS:
                return self._hosts
        partial = self._hosts.with_name(f".hosts-{os.getpid()}-{threading.get_ident()}")
        partial.write_text(HOSTS)
        partial.chmod(0o644)
        os.replace(partial, self._hosts)
        return self._hosts

    def _run_container(self, sandbox_id: str, profile: Profile, workspace: Path,
                       socket_dir: Path, env: dict[str, str], memory: int,
                       mounts: list[Mount]) -> str:
        gvisor = profile.runtime == "gvisor"
        ulimits = [Ulimit(name="nofile", soft=profile.nofile, hard=profile.nofile),
                   Ulimit(name="core", soft=0, hard=0)]
        if gvisor:
            # gVisor counts the sandbox's tasks per user in its own kernel, so RLIMIT_NPROC is
            # the sandbox's process limit there (under runc it would count the host's uid 1000).
            ulimits.append(Ulimit(name="nproc", soft=profile.pids, hard=profile.pids))
        # The API's create and start, not docker-py's ``containers.run``, which inspects the
        # container between them to build an object only its id is read of: a request less
        # (10-25 ms a start from a kernel template on a busy host).
        host_config = self.client.api.create_host_config(
            network_mode="none",
            read_only=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            ipc_mode="private",
            mem_limit=memory,
            memswap_limit=memory,
            mem_swappiness=0,
            nano_cpus=int(profile.cpus * 1e9),
            cpu_shares=SANDBOX_CPU_SHARES,
            runtime=ENGINE_RUNTIMES[profile.runtime],
            pids_limit=host_pids_limit(profile) if gvisor else profile.pids,
            ulimits=ulimits,
            tmpfs={"/tmp": f"rw,nosuid,nodev,size={parse_size(profile.tmp_size)},mode=1777"},
            shm_size="64m",
            mounts=mounts,
            oom_score_adj=500,
        )
        create = partial(
            self.client.api.create_container, profile.image, name=container_name(sandbox_id),
            detach=True, labels=self._labels(sandbox_id, profile, workspace, socket_dir),
            hostname="sandbox", user=f"{SANDBOX_UID}:{SANDBOX_GID}",
            network_disabled=True,  # no network sandbox of the engine's: see HOSTS
            environment=env, command=[] if profile.huge_pages or gvisor else [SMALL_PAGES],
            working_dir=SANDBOX_PATH, host_config=host_config)
        try:
            created = create()
        except docker.errors.ImageNotFound:  # pulled, as ``containers.run`` did
            self.client.images.pull(profile.image)
            created = create()
        container_id = str(created["Id"])
        self.client.api.start(container_id)
        return container_id

    def remove_container(self, container_id: str) -> None:
        """Remove a container (blocking), and wait for a removal already under way (someone
        else's ``docker rm``): a new container of the same name can only follow it."""
        slow = 0
        for attempt in range(REMOVAL_WAITS):
            try:
                with self._lifecycle:
                    self.client.api.remove_container(container_id, force=True, v=True)
                return
            except docker.errors.NotFound:
                return
            except docker.errors.APIError as exc:
                if exc.status_code != 409 or attempt == REMOVAL_WAITS - 1:
                    raise
            except requests.exceptions.ReadTimeout:
                # The engine is still at it: asking again waits for it (409, then not found).
                slow += 1
                if slow == SLOW_REMOVALS:
                    raise
                logger.warning("container %s: its removal outlasted the engine client's "
                               "timeout; waiting on", container_id[:12])
                continue
            time.sleep(0.1)

    @staticmethod
    def make_socket_dir(path: Path) -> None:
        """``run/<id>/kernel``, the sandbox's writable socket folder (its kernel binds there).

        As root, ``run/<id>`` is a tiny tmpfs of its own, so the sandbox cannot fill the host's
        disk through the folder; the gateway's private files (egress) sit beside it, out of
        the sandbox's reach, on the same file system.
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0 and not os.path.ismount(path.parent):
            _mount(["-t", "tmpfs", "-o", SOCKET_DIR_TMPFS, "tmpfs", str(path.parent)])
        path.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            os.chown(path, SANDBOX_UID, SANDBOX_GID)
            os.chmod(path, 0o700)
        else:
            os.chmod(path, 0o777)

    @staticmethod
    def unmount_socket_dir(path: Path) -> None:
        """Unmount a stopped sandbox's socket folder (see :meth:`make_socket_dir`)."""
        if os.path.ismount(path.parent):
            try:
                detach(path.parent)
            except WorkspaceError as exc:
                raise BackendError(str(exc)) from exc

    @staticmethod
    def _remove_dirs(workspace: Workspace, socket_dir: Path) -> None:
        workspace.destroy()
        # run/<id>/kernel: remove run/<id> (a tmpfs as root); an older layout had run/<id>.
        root = socket_dir.parent if socket_dir.name == SOCKET_SUBDIR else socket_dir
        if os.path.ismount(root):
            with contextlib.suppress(WorkspaceError):
                detach(root)
        shutil.rmtree(root, ignore_errors=True)

    def _discard(self, sandbox_id: str, workspace_dir: Path, socket_dir: Path) -> None:
        """Remove a half-made sandbox (blocking); parts that were never made are skipped."""
        try:
            self.remove_container(container_name(sandbox_id))
        except docker.errors.DockerException as exc:
            logger.warning("could not remove container of sandbox %s: %s", sandbox_id, exc)
        self._remove_dirs(Workspace(workspace_dir, workspace_dir.with_suffix(".ext4")),
                          socket_dir)

    async def image_languages(self, image: str) -> tuple[str, ...]:
        """The languages ``image`` offers, by its label (asked of the engine once per image)."""
        if image not in self._languages:
            try:
                details = await call_engine(self.client.api.inspect_image, image)
            except BackendError:
                return ("python",)  # not asked again: the next sandbox's creation may find it
            self._languages[image] = tuple(offered((details.get("Config") or {}).get("Labels")))
        return self._languages[image]

    async def image_digest(self, image: str) -> str | None:
        try:
            details = await call_engine(self.client.api.inspect_image, image)
        except BackendError:
            return None
        return str(details.get("Id")) or None

    async def list_sandboxes(self) -> list[SandboxInfo]:
        containers = await call_engine(self.client.api.containers, all=True,
                                       filters={"label": f"{LABEL_OWNER}={self.settings.owner}"})
        # The owner label alone is not enough: two gateways on different state directories may
        # share an owner (the default), and each must leave the other's sandboxes alone.
        mine = await in_thread(self._in_state_dir, [
            (item.get("Labels") or {}).get("io.replgate.workspace", "") for item in containers])
        found = []
        for item, ours in zip(containers, mine, strict=True):
            if not ours:
                continue
            labels = item.get("Labels") or {}
            found.append(SandboxInfo(
                sandbox_id=labels.get(LABEL_SANDBOX, ""), backend=self.name,
                profile=labels.get(LABEL_PROFILE, "default"), container_id=item["Id"],
                workspace=labels.get("io.replgate.workspace", ""),
                socket_dir=labels.get("io.replgate.sockets", "")))
        return found

    async def list_on_host(self) -> list[SandboxInfo]:
        return await in_thread(self._on_host)

    def _on_host(self) -> list[SandboxInfo]:
        """The sandboxes named in ``workspaces/`` and ``run/`` (blocking)."""
        ids: set[str] = set()
        for folder in (self._workspaces, self._run_dir):
            with contextlib.suppress(FileNotFoundError):
                ids.update(name.removesuffix(".ext4") for name in os.listdir(folder))
        return [SandboxInfo(sandbox_id=sandbox_id, backend=self.name, profile="",
                            container_id=container_name(sandbox_id),
                            workspace=str(self._workspaces / sandbox_id),
                            socket_dir=str(self._run_dir / sandbox_id / SOCKET_SUBDIR))
                for sandbox_id in sorted(ids)]

    def _in_state_dir(self, workspaces: list[str]) -> list[bool]:
        """Which workspace paths lie in this gateway's state directory (symlinks resolved)."""
        own = os.path.realpath(self._workspaces)
        return [bool(path) and os.path.dirname(os.path.realpath(path)) == own
                for path in workspaces]

    async def remove(self, info: SandboxInfo, workspace: Workspace | None = None) -> None:
        """``workspace``: the sandbox's own, whose lock its file operations hold (else one
        made from ``info``, for a sandbox not loaded)."""
        await call_engine(self.remove_container, info.container_id)
        if info.sandbox_id:  # a replacement container made under the same name
            await call_engine(self.remove_container, container_name(info.sandbox_id))
        workspace = workspace or Workspace(Path(info.workspace),
                                           Path(info.workspace).with_suffix(".ext4"))
        if info.workspace:
            await in_thread(self._remove_dirs, workspace, Path(info.socket_dir))
