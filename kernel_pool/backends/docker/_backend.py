"""The Docker backend: one hardened container per sandbox, kernels reached over ZMQ ipc.

The container has no network at all; the kernel's ZMQ sockets are Unix sockets in a folder
bind-mounted from the host (``/kernel``). Every blocking Docker SDK call runs in a worker
thread (``anyio.to_thread``), never on the event loop. Containers carry labels naming the
owning gateway and sandbox, so a restarted gateway finds, re-adopts or removes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import secrets
import select
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests.exceptions
from docker.types import Mount, Ulimit

from kernel_pool._languages import KERNEL_LANGUAGES, offered
from kernel_pool._workspace import SANDBOX_GID, SANDBOX_PATH, SANDBOX_UID, Workspace, detach
from kernel_pool.backends.base import (
    CgroupUsage,
    CommandProcess,
    Sandbox,
    SandboxBackend,
    SandboxInfo,
    SandboxSpec,
)
from kernel_pool.backends.docker._cgroup import CgroupReader
from kernel_pool.backends.docker._checkpoint import (
    CONTAINERD_STAGING,
    TREE_KEY,
    CheckpointError,
    Packing,
    checkpoint_dir,
    checkpoint_failure,
    discard,
    dump,
    folder_bytes,
    loopback_settled,
    remove_staged_copies,
    whole_dump,
)
from kernel_pool.backends.docker._checkpoint import restore as restore_checkpoint
from kernel_pool.backends.docker._commands import DockerCommand
from kernel_pool.backends.docker._context import DockerContextSandbox
from kernel_pool.backends.docker._criu import RUNC_CRIU_CONFIG, checkpoint_support, dumps_file_locks
from kernel_pool.backends.docker._docker import (
    DATA_ROOT,
    KERNEL_DIR,
    LABEL_OWNER,
    LABEL_PROFILE,
    LABEL_SANDBOX,
    SOCKET_SUBDIR,
    _connection,
    _in_thread,
    _read_connection_file,
    _run,
    container_name,
)
from kernel_pool.backends.docker._freezer import Freezer
from kernel_pool.backends.docker._gvisor import (
    ENGINE_RUNTIMES,
    OOM_POLL_S,
    OutOfMemoryWatch,
    Runsc,
    host_pids_limit,
    missing_runtime,
)
from kernel_pool.backends.docker._init_kernel import (
    CONTEXT_KERNEL_NAME,
    KERNEL_NAME,
    PID_WAIT_S,
    container_pid,
    exit_code,
    find_kernel,
    host_pid,
    latest_kernel,
    request_adoption,
    request_kernel,
    write_for_sandbox,
)
from kernel_pool.backends.docker._strays import (
    GONE_WAIT_S,
    find_strays,
    kill_strays,
    process_alive,
    wait_gone,
)
from kernel_pool.backends.docker._template import (
    TEMPLATE_PID,
    Template,
    TemplateError,
    answered,
    first_pid,
    rekey,
    remove_stale_parts,
)
from kernel_pool.backends.docker._template import dump as dump_template
from kernel_pool.backends.docker._template import find as find_template
from kernel_pool.backends.docker._template import refusal as templates_refusal
from kernel_pool.backends.docker._template import remove_others as remove_other_templates
from kernel_pool.backends.docker._template import restore as restore_template
from kernel_pool.backends.docker._tree import dump as dump_tree
from kernel_pool.backends.docker._tree import outside_the_tree, resume_stopped, sysv_objects
from kernel_pool.backends.docker._tree import restore as restore_tree
from kernel_pool.config import PoolSettings, Profile, parse_size
from kernel_pool.exceptions import BackendError, WorkspaceError

logger = logging.getLogger(__name__)

OOM_RECORD_WAITS = 30
"""Tenths of a second to wait for the engine's record of a gVisor sandbox's death."""
REMOVAL_WAITS = 300
"""Tenths of a second to wait for a container's removal that is already in progress."""
SANDBOX_CPU_SHARES = 512
"""Half the default CPU weight (CIS Docker Benchmark 5.11): where each container is a cgroup of
its own beside the gateway's (systemd's cgroup driver), busy sandboxes must not starve the
gateway that serves every session. Sandboxes stay equal among themselves."""
SOCKET_DIR_TMPFS = "size=1m,nr_inodes=64,mode=0755,nosuid,nodev,noexec"
"""The file system of a sandbox's socket folder, as root: sockets and a connection file."""
KERNEL_COMMAND = ("python", "-P", "-m", "replgate_kernel", "-f")
"""``-P``: the working directory (the workspace) is not on sys.path while the kernel starts.
The per-output cap (``--max-output-bytes``) goes before ``-f``, in the command line, where the
session's code cannot raise it for the host (which applies its own caps anyway)."""
TEMPLATE_ATTEMPTS = 2
"""Templates made per profile in a gateway's life, when restores from them fail."""
KERNEL_REKEY_TIMEOUT_S = 10.0
TREE_STOP_TIMEOUT_S = 30
"""A container killed after its kernel's tree was dumped ends at once; the wait is bounded."""
# Sandboxed code runs as this user; PID 1 is spared by kill(-1), so the container survives.
KILL_ALL = ["/bin/sh", "-c", "kill -KILL -1"]
RELAY_SETTLE_S = 1.0
"""How long Deno's relay may take to close its connections to the kernel before a dump."""


def _mount(arguments: list[str]) -> None:
    result = subprocess.run(["mount", *arguments], capture_output=True, text=True)
    if result.returncode != 0:
        raise BackendError(f"mount {' '.join(arguments)} failed: {result.stderr.strip()}")


class DockerSandbox(Sandbox):
    """One container; its PID 1 starts each kernel (``docker exec`` does under gVisor)."""

    def __init__(self, backend: DockerBackend, info: SandboxInfo, profile: Profile,
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
        self.memory_path: str | None = None
        """How the last memory pause dumped, or resume restored, the sandbox: ``"kernel
        tree"`` (CRIU inside the container, :mod:`._tree`) or ``"engine"`` (the whole
        container, runc's dump and the engine's ``start --checkpoint``)."""

    @property
    def _api(self) -> docker.APIClient:
        return self._backend.client.api

    @property
    def _socket_dir(self) -> Path:
        return Path(self.info.socket_dir)

    async def _running(self) -> bool:
        try:
            state = (await _run(self._api.inspect_container, self.info.container_id))["State"]
        except BackendError:
            return False
        # A container being removed (someone's `docker rm -f`) still says Running, and so does
        # one whose init was just killed until the engine reaps it: ask the host's process table.
        return (bool(state.get("Running")) and state.get("Status") == "running"
                and process_alive(int(state.get("Pid") or 0)))

    async def _ensure_running(self) -> None:
        if not await self._running():
            await _run(self._backend.remove_container, self.info.container_id)
            self.info.container_id = await _run(
                self._backend.run_container, self.info.sandbox_id, self.profile,
                self.workspace.root, self._socket_dir, self._env)
            self._cgroup = None
            self.fresh = True
        if self._cgroup is None:
            await self._find_init()

    async def _find_init(self) -> None:
        """The host pid of the (new or restored) container's PID 1, and its cgroup."""
        state = (await _run(self._api.inspect_container, self.info.container_id))["State"]
        self._init_pid = int(state.get("Pid") or 0)
        self._cgroup = CgroupReader.for_pid(self._init_pid)
        gvisor = self.profile.runtime == "gvisor"
        self._runsc = Runsc.for_sandbox(self._init_pid, self.info.container_id) if gvisor else None
        # Under gVisor the cgroup holds the sentry, whose freeze would stop the whole sandbox.
        self._freezer = (None if gvisor
                         else Freezer.for_pid(self._init_pid, self.info.container_id))

    async def launch_kernel(self) -> dict[str, Any]:
        await self._ensure_running()
        self._close_pidfd()
        fresh, self.fresh, self.from_template = self.fresh, False, False
        self._exit_code, self._sandbox_oom_kills = None, None
        # A session's own environment reaches a restored kernel as it reaches a warm one: the
        # kernel layer sets it in the process once the kernel answers (``Kernel.set_env``).
        template = (self._backend.template_for(self.profile)
                    if fresh and self._through_init else None)
        if template is not None:
            try:
                return await self._launch_from_template(template)
            except TemplateError as exc:
                logger.warning("sandbox %s: its kernel could not be restored from the "
                               "template (%s); it boots", self.info.sandbox_id, exc)
                # A container that died meanwhile (removed, say) is no fault of the template.
                if exc.template_at_fault and process_alive(self._init_pid):
                    await self._backend.drop_template(self.profile, template)
                await self.kill(restart=True)
        return await self._boot_kernel()

    async def _boot_kernel(self) -> dict[str, Any]:
        previous = self.info.kernel_name
        number = int(previous[1:]) + 1 if previous else 1
        name = f"k{number}"
        config = _connection(secrets.token_hex(32), f"{KERNEL_DIR}/{name}")
        await _in_thread(self._write_connection_file, name, config, previous)
        if self._through_init:
            await self._launch_through_init(name)
        else:
            await self._launch_by_exec(name)
        return {**config, "ip": str(self._socket_dir / name)}

    async def _launch_from_template(self, template: Template) -> dict[str, Any]:
        """Restore the template's kernel into this (fresh) container, have PID 1 adopt it, and
        give it a key of its own (and fresh random generators) before anyone else reaches it;
        :class:`TemplateError` when any step fails (the caller then boots a kernel)."""
        name = template.kernel_name
        config = _connection(secrets.token_hex(32), f"{KERNEL_DIR}/{name}")
        await _in_thread(self._write_connection_file, name, config, self.info.kernel_name)
        work = self._backend.template_work / self.info.sandbox_id
        took = await _in_thread(restore_template, template, self._init_pid,
                                self.info.container_id, work)
        logger.debug("sandbox %s: kernel restored from the template in %.3f s",
                     self.info.sandbox_id, took)
        await _in_thread(request_adoption, self._socket_dir, name, template.kernel_pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._init_pid, signal.SIGUSR1)
        self.info.kernel_name = name
        await self._watch_init_child(name, PID_WAIT_S)
        if self.info.kernel_ref is None:
            raise TemplateError("the container's PID 1 did not adopt the restored kernel")
        host = {**config, "ip": str(self._socket_dir / name)}
        await rekey(host, template.key, KERNEL_REKEY_TIMEOUT_S)
        self.from_template = True
        return host

    @property
    def _through_init(self) -> bool:
        """Under runc the kernel is PID 1's child (a checkpoint holds it); under gVisor,
        whose sandboxes are never checkpointed here, it is started by ``docker exec``."""
        return self.profile.runtime != "gvisor"

    @property
    def checkpoint_refusal(self) -> str | None:
        if self._through_init:
            return None
        return "a gVisor sandbox cannot be checkpointed with CRIU"

    def context_refusal(self, language: str) -> str | None:
        if language == "javascript" and not self._backend.file_locks:
            return (f"Deno's kernel holds file locks, which this host's CRIU keeps only with "
                    f"file-locks in {RUNC_CRIU_CONFIG} (./run.sh writes it)")
        return None

    @property
    def pipe_folder(self) -> tuple[Path, str] | None:
        # The socket folder is a bind mount: a pipe made there is the kernel's too. gVisor's
        # gofer does not pass a host pipe through.
        return (self._socket_dir, KERNEL_DIR) if self._through_init else None

    async def _launch_through_init(self, name: str) -> None:
        # Written once: a container remade below reads it as it starts (so a second request
        # would start a second kernel), and a signal without a request does nothing.
        async def signal_init() -> None:
            for attempt in range(3):
                try:
                    await _run(self._api.kill, self.info.container_id, "SIGUSR1")
                    return
                except BackendError:  # stopped or removed since it was checked: remake it
                    if attempt == 2 or await self._running():
                        raise
                    await self._ensure_running()

        self.info.kernel_name = name
        self._keep_init_child(*await self._ask_init(name, "python", None, signal_init))

    async def start_by_init(self, name: str, language: str,
                            env: dict[str, str]) -> tuple[int | None, int | None]:
        """Have PID 1 start a code context's kernel of ``language``, named ``name``, with
        ``env`` over the container's environment: (its host pid, None), or (None, its exit
        code) when it did not start."""
        if not process_alive(self._init_pid):
            raise BackendError("the session's container is not running")

        async def signal_init() -> None:
            try:
                os.kill(self._init_pid, signal.SIGUSR1)
            except ProcessLookupError as exc:
                raise BackendError("the session's container stopped") from exc

        pid, code = await self._ask_init(name, language, env, signal_init)
        return (pid, None) if pid is not None else (None, code if code is not None else -1)

    async def _ask_init(self, name: str, language: str, env: dict[str, str] | None,
                        signal_init: Callable[[], Awaitable[None]],
                        ) -> tuple[int | None, int | None]:
        """Write the request for kernel ``name``, signal PID 1 by ``signal_init`` and wait
        for the kernel: (host pid, exit code) as :func:`find_kernel` answers. One request at
        a time: PID 1 reads one file."""
        async with self._launching:
            await _in_thread(request_kernel, self._socket_dir, name,
                             self.profile.caps.display_bytes, language, env)
            await signal_init()
            return await _in_thread(find_kernel, self._socket_dir, name, self._init_pid,
                                    PID_WAIT_S)

    async def _watch_init_child(self, name: str, wait_s: float) -> None:
        """Find the kernel PID 1 started (its host pid, and a pidfd for its exit)."""
        found = await _in_thread(find_kernel, self._socket_dir, name, self._init_pid, wait_s)
        self._keep_init_child(*found)

    def _keep_init_child(self, pid: int | None, code: int | None) -> None:
        """Keep the kernel found (``pid``), or the exit code of one that did not start."""
        if pid is None:
            self.info.kernel_ref = None
            self._exit_code = code if code is not None else -1
            return
        self.info.kernel_ref = str(pid)
        self._open_pidfd(pid)

    async def _launch_by_exec(self, name: str) -> None:
        for attempt in range(3):
            try:
                exec_id = (await _run(
                    self._api.exec_create, self.info.container_id,
                    [*KERNEL_COMMAND[:-1],
                     f"--max-output-bytes={self.profile.caps.display_bytes}",
                     KERNEL_COMMAND[-1], f"{KERNEL_DIR}/{name}.json"],
                    user=f"{SANDBOX_UID}:{SANDBOX_GID}", workdir=SANDBOX_PATH,
                    stdout=False, stderr=False))["Id"]
                await _run(self._api.exec_start, exec_id, detach=True)
                break
            except BackendError:  # stopped or removed since it was checked: remake it
                if attempt == 2 or await self._running():
                    raise
                await self._ensure_running()
        self.info.kernel_name, self.info.kernel_ref = name, exec_id
        self._oom_watch = (
            OutOfMemoryWatch(parse_size(self.profile.memory), self._cgroup.read().oom_kills or 0)
            if self._runsc is not None and self._cgroup is not None else None)
        await self._watch(exec_id)

    async def connection_info(self) -> dict[str, Any] | None:
        if not self.info.kernel_name or await self.poll() is not None:
            return None
        path = self._socket_dir / f"{self.info.kernel_name}.json"
        config = await _in_thread(_read_connection_file, path)
        return {**config, "ip": str(self._socket_dir / self.info.kernel_name)}

    def _write_connection_file(self, name: str, config: dict[str, Any],
                               previous: str | None) -> None:
        if previous:
            for stale in self._socket_dir.glob(f"{previous}*"):
                stale.unlink(missing_ok=True)
        # PID 1's records of earlier kernels (one may land after the glob above: it records
        # a kernel's end once it reaps it), so they never fill the small folder.
        for pattern in ("k*.pid", "k*.exit"):
            for stale in self._socket_dir.glob(pattern):
                stale.unlink(missing_ok=True)
        # The folder is writable by the sandbox, which may have planted a link at any name:
        # at the socket paths the gateway will connect to (it retries until the kernel binds
        # them), no planted link may send it to a host socket in the meantime.
        for planted in self._socket_dir.glob(f"{name}-*"):
            planted.unlink(missing_ok=True)
        write_for_sandbox(self._socket_dir / f"{name}.json", json.dumps(config))

    async def _watch(self, exec_id: str) -> None:
        """Find an exec'd kernel's host pid, and a pidfd that becomes readable when it exits."""
        for _ in range(50):
            details = await _run(self._api.exec_inspect, exec_id)
            if details.get("Pid") or not details.get("Running"):
                break
            await asyncio.sleep(0.02)
        pid = int(details.get("Pid") or 0)
        if not details.get("Running") or not pid:
            self._exit_code = int(details.get("ExitCode") or -1)
            return
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

    async def poll(self) -> int | None:
        if self._exit_code is not None:
            return self._exit_code
        if not self.info.kernel_ref:
            return -1
        if self._through_init:
            return await self._poll_init_child()
        try:
            details = await _in_thread(self._api.exec_inspect, self.info.kernel_ref)
        except docker.errors.NotFound:
            # Its container was removed (a gVisor sandbox's hard stop replaces it): the
            # engine forgets its execs, and the kernel was killed with it.
            self._exit_code = -signal.SIGKILL
            return self._exit_code
        except docker.errors.DockerException as exc:
            raise BackendError(f"Docker engine: {exc}") from exc
        except requests.exceptions.RequestException as exc:
            raise BackendError(f"Docker engine did not answer: {exc}") from exc
        if details.get("Running"):
            return None
        code = details.get("ExitCode")
        self._exit_code = int(code) if code is not None else -1
        return self._exit_code

    async def _poll_init_child(self) -> int | None:
        if self._pidfd is not None:
            # A pidfd reads as ready once its process has exited.
            if not select.select([self._pidfd], [], [], 0)[0]:
                return None
        elif self._pid and process_alive(self._pid):
            return None
        if not process_alive(self._init_pid):
            # The container stopped (removed, or its init killed): the kernel died with it
            # and nothing reaped it to record a status.
            self._exit_code = -signal.SIGKILL
            return self._exit_code
        name = self.info.kernel_name or ""
        code = await _in_thread(exit_code, self._socket_dir, name)
        if code is None:
            return None  # reaped in a moment: PID 1 writes the record right after
        self._exit_code = code
        return code

    async def wait(self) -> int:
        if self._pidfd is not None:
            loop = asyncio.get_running_loop()
            exited: asyncio.Future[None] = loop.create_future()
            fd = self._pidfd

            def readable() -> None:
                if not exited.done():
                    exited.set_result(None)

            loop.add_reader(fd, readable)
            try:
                poll = OOM_POLL_S if self._oom_watch is not None else None
                while not exited.done():
                    await asyncio.wait([exited], timeout=poll)
                    if not exited.done():
                        await self._end_if_stuck_out_of_memory()
            finally:
                loop.remove_reader(fd)
            if self._oom_watch is not None:
                await self._note_sandbox_killed_out_of_memory()
            # The engine's exec record (or PID 1's) may lag the process by a moment.
            for _ in range(50):
                code = await self.poll()
                if code is not None:
                    return code
                await asyncio.sleep(0.02)
            return -1
        while (code := await self.poll()) is None:  # noqa: ASYNC110 (no pidfd: poll the engine)
            await asyncio.sleep(0.5)
        return code

    async def _note_sandbox_killed_out_of_memory(self) -> None:
        """Under gVisor: when the host's OOM killer chose gVisor's kernel itself, the whole
        sandbox died with the kernel, and its cgroup (with the OOM count) went with it; the
        engine saw the kill (``State.OOMKilled``), which :meth:`usage` then reports."""
        watch = self._oom_watch
        if watch is None or self._cgroup is None:
            return
        # Read now: a dead sandbox's cgroup may still be there for a moment, and gone when
        # the kernel's death is reported.
        kills = self._cgroup.read().oom_kills
        if kills is not None:
            if kills > watch.at_start:
                self._sandbox_oom_kills = kills
            return
        # The engine learns of the kill and of the exit by events of its own, a moment after
        # the kernel's end: its record is final once it shows the container stopped.
        for _ in range(OOM_RECORD_WAITS):
            try:
                state = (await _run(self._api.inspect_container,
                                    self.info.container_id))["State"]
            except BackendError:
                return  # already removed: no evidence left
            if state.get("OOMKilled"):
                self._sandbox_oom_kills = max(watch.seen, watch.at_start + 1)
                return
            if not state.get("Running"):
                return
            await asyncio.sleep(0.1)

    async def _end_if_stuck_out_of_memory(self) -> None:
        """Under gVisor: after an OOM kill that left the sandbox at its limit, kill its
        processes (PID 1 spared), so the kernel ends as under runc, its death reported with
        the cgroup's OOM count as the reason, instead of hanging until a timeout."""
        watch, runsc, cgroup = self._oom_watch, self._runsc, self._cgroup
        if watch is None or runsc is None or cgroup is None or not watch.stuck(cgroup.read()):
            return
        logger.warning("sandbox %s: out of memory (limit %s) and stuck; killing its processes",
                       self.info.sandbox_id, self.profile.memory)
        if not await runsc.kill_all_but_init():
            await _run(self._backend.remove_container, self.info.container_id)

    async def send_signal(self, signum: int) -> None:
        if self._pidfd is not None:
            signal.pidfd_send_signal(self._pidfd, signum)
        elif self._pid:
            await _run(self._api.exec_create, self.info.container_id,
                       ["/bin/sh", "-c", f"kill -{signum} -1"], user=f"{SANDBOX_UID}")

    async def kill(self, restart: bool = False) -> None:
        if restart and self.profile.runtime == "gvisor":
            # The cgroup holds gVisor's own processes, not the sandboxed ones: the hard stop
            # replaces the container (a fresh gVisor kernel; launch_kernel makes it, the
            # workspace stays), which no swarm of processes inside can slow down.
            await _run(self._backend.remove_container, self.info.container_id)
            return
        if restart:
            procs = self._cgroup.procs_file if self._cgroup is not None else None
            if procs is not None and self._init_pid and procs.exists():
                # From the host, through the container's cgroup: this needs no new process in
                # the container, which a fork bomb at the pids limit leaves no room for.
                await _in_thread(kill_strays, procs, self._init_pid, 0, False, (),
                                 self._freezer)
                if not await _in_thread(wait_gone, procs, self._init_pid):
                    logger.warning("sandbox %s: processes killed for a restart still run "
                                   "after %g s", self.info.sandbox_id, GONE_WAIT_S)
                return
            try:
                exec_id = (await _run(self._api.exec_create, self.info.container_id, KILL_ALL,
                                      user=f"{SANDBOX_UID}:{SANDBOX_GID}"))["Id"]
                await _run(self._api.exec_start, exec_id)
            except BackendError:
                pass  # the container is gone: launch_kernel makes a new one
        else:
            await _run(self._backend.remove_container, self.info.container_id)

    async def cleanup(self, restart: bool = False) -> None:
        self._close_pidfd()
        if restart:
            return
        await self._backend.remove(self.info, self.workspace)

    # cgroup files are kernel pseudo-files answered from memory in microseconds, never from a
    # disk: read on the loop, since a worker-thread hop would cost more than the read itself
    # and sits on every execution's path.
    async def usage(self) -> CgroupUsage:
        if self._cgroup is None:
            return CgroupUsage()
        reading = self._cgroup.read()
        if reading.oom_kills is None:
            reading.oom_kills = self._sandbox_oom_kills
        return reading

    async def reset_peak_memory(self) -> bool:
        if self._cgroup is None:
            return False
        return self._cgroup.reset_peak()

    async def kill_strays(self, keep_kernel_children: bool = True) -> int:
        if self.profile.runtime == "gvisor":
            if self._runsc is None:
                return 0
            gone = await self._runsc.kill_strays(keep_kernel_children)
            if gone is None:  # not paused, or not resumed: the kernel's death is then handled
                logger.warning("sandbox %s: processes outlived the execution and the sandbox "
                               "could not be paused to kill them; replacing it",
                               self.info.sandbox_id)
                await _run(self._backend.remove_container, self.info.container_id)
                return 0
            return gone
        procs = self._cgroup.procs_file if self._cgroup is not None else None
        if procs is None or not self._pid or not self._init_pid:
            return 0
        spared = frozenset(self._commands | self.context_pids)
        # Pseudo-files again: the usual case, nothing to kill, is found on the loop.
        if not find_strays(procs, self._init_pid, self._pid, keep_kernel_children, spared):
            return 0
        killed: int = await _in_thread(kill_strays, procs, self._init_pid, self._pid,
                                       keep_kernel_children, spared, self._freezer)
        return killed

    @property
    def procs_file(self) -> Path | None:
        """The container's cgroup list of processes (host pids), once it runs under runc."""
        return self._cgroup.procs_file if self._cgroup is not None else None

    async def add_kernel(self, language: str, name: str, env: dict[str, str], *,
                         restored: bool = False) -> Sandbox:
        if not self._through_init:
            raise BackendError("code contexts in other languages need a runc sandbox; this "
                               "profile runs gVisor")
        face = DockerContextSandbox(self, language, name, {**self._env, **env})
        if restored:
            found = self._restored_contexts.pop(name, None)
            if found is None:
                raise BackendError("its kernel was not in the restored sandbox")
            face.adopt(*found)
        self._context_faces[name] = face
        return face

    def context_ended(self, face: DockerContextSandbox) -> None:
        """A context's kernel was removed for good: no checkpoint records it."""
        if self._context_faces.get(face.name) is face:
            del self._context_faces[face.name]

    def _context_records(self) -> list[dict[str, Any]]:
        """The running contexts' kernels, for a checkpoint's records: each one's context
        name, kernel name, language, pid inside the container and connection key."""
        records = []
        for name, face in self._context_faces.items():
            kernel_name, pid = face.info.kernel_name, face.pid
            inside = container_pid(pid) if pid else None
            if kernel_name and inside is not None:
                records.append({"name": name, "kernel_name": kernel_name, "pid": inside,
                                "key": face.key, "language": face.language})
        return records

    async def checkpoint(self) -> Path:
        """runc's checkpoint of the container (CRIU on the engine's host), in the folder the
        engine restores from (see :mod:`._checkpoint`)."""
        name = self.info.kernel_name
        if not self._through_init or not name or not self._pid:
            raise BackendError("only a running kernel of a runc sandbox can be checkpointed")
        about = await _in_thread(self._kernel_records, name)
        # A relay closes its loopback connections to the kernel once the host's are gone (the
        # caller dropped them); CRIU refuses those still open or closing.
        relayed = any(KERNEL_LANGUAGES[record["language"]].relayed
                      for record in about["contexts"])
        if relayed and not await _in_thread(loopback_settled, self._init_pid, RELAY_SETTLE_S):
            logger.info("sandbox %s: a TCP connection is still open after %g s; CRIU "
                        "may refuse the dump", self.info.sandbox_id, RELAY_SETTLE_S)
        folder = await self._checkpoint_tree(about) if self._backend.tree_checkpoints else None
        if folder is None:
            try:
                folder = await _run(dump, self._api, self.info.container_id,
                                    self._checkpoint_dir, about)
            except (CheckpointError, OSError) as exc:
                raise checkpoint_failure(exc) from exc
            self.memory_path = "engine"
        self._close_pidfd()
        self._pid, self._cgroup, self.info.kernel_ref = None, None, None
        return folder

    async def _checkpoint_tree(self, about: dict[str, Any]) -> Path | None:
        """The kernel's tree dumped from inside the container, which is then stopped (see
        :mod:`._tree`); None, the kernel running on, where it cannot hold everything or
        fails (the caller then dumps the whole container)."""
        procs = self._cgroup.procs_file if self._cgroup is not None else None
        if procs is None or not self._pid:
            return None
        outside = await _in_thread(outside_the_tree, procs, self._init_pid, self._pid)
        if outside:
            logger.info("sandbox %s: %d processes outside the kernel's tree; the whole "
                        "container is dumped", self.info.sandbox_id, outside)
            return None
        try:
            shared = await _in_thread(sysv_objects, self._init_pid)
        except (OSError, subprocess.SubprocessError) as exc:
            logger.warning("sandbox %s: its System V IPC objects could not be listed (%s); "
                           "the whole container is dumped", self.info.sandbox_id, exc)
            return None
        if shared:
            logger.info("sandbox %s: %d System V IPC objects, which a tree dump does not "
                        "hold; the whole container is dumped", self.info.sandbox_id, shared)
            return None
        started = time.monotonic()
        try:
            await _in_thread(self._dump_tree, procs, about)
        except (TemplateError, CheckpointError, OSError, docker.errors.APIError) as exc:
            logger.warning("sandbox %s: the kernel-tree dump failed (%s); the engine's runc "
                           "dumps the whole container instead", self.info.sandbox_id,
                           checkpoint_failure(exc))
            return None
        logger.info("sandbox %s: memory pause by a kernel-tree dump in %.3f s",
                    self.info.sandbox_id, time.monotonic() - started)
        self.memory_path = "kernel tree"
        return self._checkpoint_dir

    def _dump_tree(self, procs: Path, about: dict[str, Any]) -> None:
        dump_tree(self._init_pid, self.info.container_id, procs, int(about["kernel_pid"]),
                  self._checkpoint_dir, about)
        # Looked at again now that the tree is stopped: a process that left it since the first
        # look (an orphan re-parented to PID 1) is in no image and would die with the container.
        if self._pid and outside_the_tree(procs, self._init_pid, self._pid):
            discard(self._checkpoint_dir)
            resume_stopped(procs, self._init_pid)
            raise CheckpointError("a process left the kernel's tree while it was dumped")
        # The tree is stopped, its image whole: the container ends as after runc's dump.
        try:
            self._api.kill(self.info.container_id)
        except docker.errors.APIError:
            discard(self._checkpoint_dir)
            resume_stopped(procs, self._init_pid)
            raise
        try:
            self._api.wait(self.info.container_id, timeout=TREE_STOP_TIMEOUT_S)
        except (OSError, docker.errors.APIError) as exc:
            # Killed with its image whole: a slow answer is no reason to dump it again (the
            # caller's fallback would find the container gone).
            logger.warning("sandbox %s: the engine did not confirm the container's end (%s)",
                           self.info.sandbox_id, exc)

    def _restore_tree(self) -> None:
        """Restore the kernel's tree into the started container (blocking)."""
        started = time.monotonic()
        init_pid = int(self._api.inspect_container(self.info.container_id)["State"]["Pid"])
        work = self._backend.template_work / self.info.sandbox_id
        try:
            restore_tree(init_pid, self.info.container_id, self._checkpoint_dir, work)
        except TemplateError as exc:
            raise CheckpointError(f"the kernel's tree could not be restored: {exc}") from exc
        logger.info("sandbox %s: kernel tree restored inside its container in %.3f s",
                    self.info.sandbox_id, time.monotonic() - started)

    @property
    def _checkpoint_dir(self) -> Path:
        return checkpoint_dir(self._backend.data_root, self.info.container_id)

    async def checkpoint_bytes(self, dump: Path) -> int:
        try:
            return await _in_thread(folder_bytes, dump)
        except OSError as exc:
            raise checkpoint_failure(exc) from exc

    async def pack_checkpoint(self, dump: Path, stem: Path) -> Path:
        packing = Packing(dump, stem)
        work = asyncio.ensure_future(_in_thread(packing.run))
        try:
            image = await asyncio.shield(work)
        except asyncio.CancelledError:
            # The thread's tar and zstd are killed, so the wait for it is short.
            packing.cancel()
            await asyncio.wait([work])
            if not work.cancelled():
                work.exception()
            raise
        except (CheckpointError, OSError) as exc:
            raise checkpoint_failure(exc) from exc
        await _in_thread(discard, dump)
        return image

    async def discard_checkpoint(self, dump: Path) -> None:
        await _in_thread(discard, dump)

    async def left_checkpoint(self) -> Path | None:
        return await _in_thread(whole_dump, self._checkpoint_dir)

    def _kernel_records(self, name: str) -> dict[str, Any]:
        # From the host's process table, not the sandbox's own record of it.
        pid = container_pid(self._pid) if self._pid else None
        try:
            key = _read_connection_file(self._socket_dir / f"{name}.json")["key"]
        except (OSError, ValueError) as exc:
            raise BackendError(f"the kernel's connection file cannot be read: {exc}") from exc
        if pid is None:
            raise BackendError("the kernel process is gone")
        return {"kernel_name": name, "kernel_pid": pid, "key": key,
                "contexts": self._context_records()}

    async def restore(self, image: Path) -> dict[str, Any]:
        try:
            about = await _run(restore_checkpoint, self._api, self.info.container_id,
                               self._checkpoint_dir, image, _TreeRestore(self))
        except (CheckpointError, OSError, docker.errors.APIError) as exc:
            raise checkpoint_failure(exc) from exc
        tree = about.get(TREE_KEY) is True
        name, pid, key = about.get("kernel_name"), about.get("kernel_pid"), about.get("key")
        if (not isinstance(name, str) or not KERNEL_NAME.fullmatch(name)
                or not isinstance(pid, int) or not isinstance(key, str) or not key.isalnum()):
            raise BackendError("the checkpoint's records are malformed")
        config = _connection(key)
        # The socket folder may have been made afresh while the sandbox was stopped: its
        # records go back, for a later gateway that takes the sandbox back (``load``).
        await _in_thread(self._write_records, name, pid,
                         {**config, "ip": f"{KERNEL_DIR}/{name}"})
        self.info.kernel_name, self._exit_code = name, None
        await self._find_init()
        if tree:
            # CRIU, the restored tree's parent, has exited: PID 1 is its parent now, and must
            # know it as its kernel to record its exit.
            await _in_thread(request_adoption, self._socket_dir, name, pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._init_pid, signal.SIGUSR1)
        await self._watch_init_child(name, 2.0)
        if self.info.kernel_ref is None:
            raise BackendError("the sandbox was restored without its kernel process")
        self._restored_contexts = await _in_thread(self._find_restored_contexts,
                                                   about.get("contexts"))
        self.memory_path = "kernel tree" if tree else "engine"
        return {**config, "ip": str(self._socket_dir / name)}

    def _find_restored_contexts(self, records: Any) -> dict[str, tuple[str, int, dict[str, Any]]]:
        """The contexts' kernels a restored image held and that run (blocking): their
        records written back to the socket folder, their host pids found."""
        found: dict[str, tuple[str, int, dict[str, Any]]] = {}
        for record in records if isinstance(records, list) else []:
            name, kernel_name = record.get("name"), record.get("kernel_name")
            pid, key = record.get("pid"), record.get("key")
            if (not isinstance(name, str) or not isinstance(kernel_name, str)
                    or not CONTEXT_KERNEL_NAME.fullmatch(kernel_name)
                    or not kernel_name.startswith(name) or not isinstance(pid, int)
                    or not isinstance(key, str) or not key.isalnum()):
                logger.warning("sandbox %s: a code context's records in its memory image are "
                               "malformed; it starts afresh", self.info.sandbox_id)
                continue
            host = host_pid(self._init_pid, pid)
            if host is None:
                continue
            config = _connection(key)
            self._write_records(kernel_name, pid, {**config, "ip": f"{KERNEL_DIR}/{kernel_name}"})
            found[name] = (kernel_name, host, {**config, "ip": str(self._socket_dir / kernel_name)})
        return found

    def _write_records(self, name: str, pid: int, config: dict[str, Any]) -> None:
        write_for_sandbox(self._socket_dir / f"{name}.json", json.dumps(config))
        write_for_sandbox(self._socket_dir / f"{name}.pid", str(pid))

    async def release(self) -> None:
        """The workspace is parked, and the socket folder's tmpfs unmounted (lazily: a
        listening egress socket may hold it until its proxy closes); ``reserve`` makes it."""
        await super().release()
        await _in_thread(self._backend.unmount_socket_dir, self._socket_dir)

    async def reserve(self) -> None:
        await super().reserve()
        await _in_thread(self._backend.make_socket_dir, self._socket_dir)

    async def start_command(self, command: str, *, env: dict[str, str],
                            cwd: str) -> CommandProcess:
        return await DockerCommand.start(
            self._api, _run, self.info.container_id, command, env=env,
            cwd=f"{SANDBOX_PATH}/{cwd}".rstrip("/"), running=self._commands)


class _TreeRestore:
    """A sandbox's kernel-tree restore, as :func:`._checkpoint.restore` drives it."""

    def __init__(self, sandbox: DockerSandbox) -> None:
        self._sandbox = sandbox

    def start(self) -> None:
        self._sandbox._api.start(self._sandbox.info.container_id)

    def restore(self, about: dict[str, Any]) -> None:
        self._sandbox._restore_tree()


class DockerBackend(SandboxBackend):
    """Sandboxes as Docker containers on the local engine (``DOCKER_HOST`` is honoured)."""

    name = "docker"

    def __init__(self, settings: PoolSettings) -> None:
        super().__init__(settings)
        try:
            self.client = docker.from_env(max_pool_size=32)
        except docker.errors.DockerException as exc:
            raise BackendError(
                f"cannot reach the Docker engine ({exc}); start it (./run.sh serve does) "
                "or set DOCKER_HOST") from exc
        self._lifecycle = threading.Lock()
        """Containers are made and removed one at a time: Docker 20.10's libnetwork can
        deadlock the whole engine on many endpoints (even ``none`` ones) created or deleted at
        once (seen here: 50 sessions deleted together). Kernel start-up is not serialized."""
        self._run_dir = settings.state_dir / "run"
        self._workspaces = settings.state_dir / "workspaces"
        self._template_root = settings.template_dir or settings.state_dir / "templates"
        self.template_work = settings.state_dir / "template-work"
        """CRIU's work folders of the restores under way, one per sandbox."""
        self._templates: dict[str, Template] = {}
        self._template_tasks: dict[str, asyncio.Task[None]] = {}
        self._template_failures: dict[str, int] = {}
        self._languages: dict[str, tuple[str, ...]] = {}

    def _labels(self, sandbox_id: str, profile: Profile, workspace: Path,
                socket_dir: Path) -> dict[str, str]:
        return {LABEL_OWNER: self.settings.owner, LABEL_SANDBOX: sandbox_id,
                LABEL_PROFILE: profile.name, "io.replgate.workspace": str(workspace),
                "io.replgate.sockets": str(socket_dir)}

    def run_container(self, sandbox_id: str, profile: Profile, workspace: Path,
                      socket_dir: Path, env: dict[str, str]) -> str:
        """Start the hardened container (blocking; called in a worker thread)."""
        memory = parse_size(profile.memory)
        with self._lifecycle:
            return self._run_container(sandbox_id, profile, workspace, socket_dir, env, memory)

    def _run_container(self, sandbox_id: str, profile: Profile, workspace: Path,
                       socket_dir: Path, env: dict[str, str], memory: int) -> str:
        gvisor = profile.runtime == "gvisor"
        ulimits = [Ulimit(name="nofile", soft=profile.nofile, hard=profile.nofile),
                   Ulimit(name="core", soft=0, hard=0)]
        if gvisor:
            # gVisor counts the sandbox's tasks per user in its own kernel, so RLIMIT_NPROC is
            # the sandbox's process limit there (under runc it would count the host's uid 1000).
            ulimits.append(Ulimit(name="nproc", soft=profile.pids, hard=profile.pids))
        container = self.client.containers.run(
            profile.image,
            name=container_name(sandbox_id),
            detach=True,
            labels=self._labels(sandbox_id, profile, workspace, socket_dir),
            hostname="sandbox",
            user=f"{SANDBOX_UID}:{SANDBOX_GID}",
            environment=env,
            working_dir=SANDBOX_PATH,
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
            mounts=[Mount(SANDBOX_PATH, str(workspace), type="bind"),
                    Mount(KERNEL_DIR, str(socket_dir), type="bind")],
            oom_score_adj=500,
        )
        return str(container.id)

    def remove_container(self, container_id: str) -> None:
        """Remove a container (blocking), and wait for a removal already under way (someone
        else's ``docker rm``): a new container of the same name can only follow it."""
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
            time.sleep(0.1)

    stopped_sandboxes = True
    templates = False
    """Whether kernels may start from templates here (see :mod:`._template`), once
    :meth:`check` found CRIU able to run and the setting asks for them."""
    templates_refusal: str | None = "the host was not checked for CRIU (the pool's start does)"
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
                await _in_thread(self.make_socket_dir, socket_dir)
            try:
                workspace = await _in_thread(
                    Workspace.create, workspace_dir, parse_size(spec.profile.workspace_size))
            except WorkspaceError as exc:  # no room on the host: the engine side's failure
                raise BackendError(f"cannot make the sandbox's workspace: {exc}") from exc
            container_id = container_name(spec.sandbox_id)
            if start:
                container_id = await _run(self.run_container, spec.sandbox_id, spec.profile,
                                          workspace.root, socket_dir, spec.env)
        except BaseException:
            # Failed or cancelled half-way: remove whatever was made (the container by name).
            await _in_thread(self._discard, spec.sandbox_id, workspace_dir, socket_dir)
            raise
        info = SandboxInfo(sandbox_id=spec.sandbox_id, backend=self.name,
                           profile=spec.profile.name, container_id=container_id,
                           workspace=str(workspace.root), socket_dir=str(socket_dir))
        sandbox = DockerSandbox(self, info, spec.profile, workspace, spec.env)
        sandbox.fresh = start
        sandbox.languages = await self.image_languages(spec.profile.image)
        return sandbox

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

    async def load(self, info: SandboxInfo, profile: Profile) -> Sandbox:
        """Take back a running sandbox: its container, workspace and running kernel, if any."""
        workspace = Workspace(Path(info.workspace), Path(info.workspace).with_suffix(".ext4"))
        details = await _run(self.client.api.inspect_container, info.container_id)
        env = dict(item.split("=", 1) for item in details["Config"].get("Env") or []
                   if "=" in item)
        sandbox = DockerSandbox(self, info, profile, workspace, env)
        sandbox.languages = await self.image_languages(profile.image)
        info.kernel_name, info.kernel_ref = None, None
        if sandbox._through_init:
            state = details.get("State") or {}
            init_pid = int(state.get("Pid") or 0) if state.get("Running") else 0
            freezer = Freezer.for_pid(init_pid, info.container_id) if init_pid else None
            if freezer is not None and not state.get("Paused"):
                # A gateway killed while it reaped strays left the freeze (the engine's own
                # pause would say Paused): nothing in the container would run again.
                await _in_thread(freezer.thaw)
            name = await _in_thread(latest_kernel, Path(info.socket_dir)) if init_pid else None
            if name is not None:
                sandbox._init_pid, info.kernel_name = init_pid, name
                await sandbox._watch_init_child(name, 0.0)
                if info.kernel_ref is not None:
                    await sandbox._ensure_running()
                else:
                    info.kernel_name = None
            return sandbox
        for exec_id in details.get("ExecIDs") or []:
            exec_details = await _run(self.client.api.exec_inspect, exec_id)
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
        info = await _run(self.client.api.info)
        self.data_root = Path(info.get("DockerRootDir") or DATA_ROOT)
        problem = missing_runtime(info.get("Runtimes") or {}, profiles)
        if problem:
            raise BackendError(problem)
        pauses = self.settings.pause_with != "variables"
        if not (pauses or self.settings.kernel_templates):
            return
        support = await _in_thread(checkpoint_support, info)
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
            self.file_locks = self.checkpoints and await _in_thread(dumps_file_locks)
            if self.checkpoint_refusal:
                # Asked for by name, it is worth a warning; `auto` makes do with variables.
                logger.log(logging.WARNING if self.settings.pause_with == "memory" else
                           logging.INFO, "REPLGATE_PAUSE_WITH=%s, but memory pauses are not "
                           "available (%s): pauses keep the variables",
                           self.settings.pause_with, self.checkpoint_refusal)
            else:
                removed = await _in_thread(remove_staged_copies)
                if removed:
                    logger.info("removed %d copies of restored memory images containerd "
                                "left in %s", removed, CONTAINERD_STAGING)

    async def load_stopped(self, info: SandboxInfo, profile: Profile,
                           env: dict[str, str]) -> Sandbox:
        """A paused session's sandbox, released (its workspace parked, no mount); its
        ``launch_kernel`` (after ``reserve``) makes its container."""
        await _in_thread(self.unmount_socket_dir, Path(info.socket_dir))
        try:
            workspace = await _in_thread(Workspace.take_back_parked, Path(info.workspace),
                                         parse_size(profile.workspace_size))
        except WorkspaceError as exc:
            raise BackendError(f"cannot take back the sandbox's workspace: {exc}") from exc
        stopped = info.model_copy(update={"kernel_name": None, "kernel_ref": None})
        sandbox = DockerSandbox(self, stopped, profile, workspace, env)
        sandbox.languages = await self.image_languages(profile.image)
        return sandbox

    async def image_languages(self, image: str) -> tuple[str, ...]:
        """The languages ``image`` offers, by its label (asked of the engine once per image)."""
        if image not in self._languages:
            try:
                details = await _run(self.client.api.inspect_image, image)
            except BackendError:
                return ("python",)  # not asked again: the next sandbox's creation may find it
            self._languages[image] = tuple(offered((details.get("Config") or {}).get("Labels")))
        return self._languages[image]

    async def image_digest(self, image: str) -> str | None:
        try:
            details = await _run(self.client.api.inspect_image, image)
        except BackendError:
            return None
        return str(details.get("Id")) or None

    async def list_sandboxes(self) -> list[SandboxInfo]:
        containers = await _run(self.client.api.containers, all=True,
                                filters={"label": f"{LABEL_OWNER}={self.settings.owner}"})
        # The owner label alone is not enough: two gateways on different state directories may
        # share an owner (the default), and each must leave the other's sandboxes alone.
        mine = await _in_thread(self._in_state_dir, [
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
        return await _in_thread(self._on_host)

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
        await _run(self.remove_container, info.container_id)
        if info.sandbox_id:  # a replacement container made under the same name
            await _run(self.remove_container, container_name(info.sandbox_id))
        workspace = workspace or Workspace(Path(info.workspace),
                                           Path(info.workspace).with_suffix(".ext4"))
        if info.workspace:
            await _in_thread(self._remove_dirs, workspace, Path(info.socket_dir))

    def template_for(self, profile: Profile) -> Template | None:
        """The template a new kernel of ``profile`` may be restored from, if one is ready;
        the first call for an eligible profile starts making it (in the background: kernels
        boot meanwhile)."""
        if not self.templates or profile.runtime != "runc" or profile.egress_allow:
            return None  # gVisor is not checkpointed with CRIU; egress runs a proxy beside
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
            await _in_thread(shutil.rmtree, template.folder, True)

    async def _make_template(self, profile: Profile) -> None:
        try:
            image = await self.image_digest(profile.image) or profile.image
            fingerprint = hashlib.sha256(
                f"{image}\n{profile.model_dump_json()}".encode()).hexdigest()[:16]
            stem = f"{profile.name}-{fingerprint}"
            template = await _in_thread(find_template, self._template_root, stem)
            if template is None:
                await _in_thread(remove_stale_parts, self._template_root)
                template = await self._dump_template(profile, stem)
                logger.info("kernel template for profile %s made: new kernels are restored "
                            "from it", profile.name)
            if self.settings.template_dir is None:  # the state directory's own: no one shares
                await _in_thread(remove_other_templates, self._template_root, profile.name,
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
        await _in_thread(partial(self._template_root.mkdir, mode=0o700, parents=True,
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
                made = await creating
                await made.kill()
                await made.cleanup()
            raise
        assert isinstance(sandbox, DockerSandbox)
        try:
            await sandbox._find_init()
            await _in_thread(first_pid, sandbox._init_pid, sandbox.info.container_id,
                             TEMPLATE_PID)
            sandbox.fresh = False
            connection = await sandbox.launch_kernel()
            await answered(connection, self.settings.kernel_start_timeout_s)
            pid = container_pid(sandbox._pid) if sandbox._pid else None
            if pid is None:
                raise TemplateError("the template's kernel is gone")
            return await _in_thread(dump_template, sandbox._init_pid, sandbox.info.container_id,
                                    pid, self._template_root, stem,
                                    sandbox.info.kernel_name or "", str(connection["key"]))
        finally:
            await sandbox.kill()
            await sandbox.cleanup()

    async def close(self) -> None:
        tasks = list(self._template_tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await _in_thread(self.client.close)
