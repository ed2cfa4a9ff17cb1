"""How a Docker sandbox starts its kernel: from a template, through PID 1, or by exec."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from kernel_pool._disk import SANDBOX_GID, SANDBOX_UID
from kernel_pool._workspace import SANDBOX_PATH
from kernel_pool.backends.docker._docker import (
    KERNEL_DIR,
    call_engine,
    in_thread,
    kernel_connection,
    read_connection_file,
)
from kernel_pool.backends.docker._gvisor import OutOfMemoryWatch
from kernel_pool.backends.docker._init_kernel import (
    PID_WAIT_S,
    find_kernel,
    request_adoption,
    request_kernel,
    start_errors,
    write_for_sandbox,
)
from kernel_pool.backends.docker._sandbox_base import DockerSandboxBase
from kernel_pool.backends.docker._strays import process_alive
from kernel_pool.backends.docker._strays import signal_init as signal_init_process
from kernel_pool.backends.docker._template import Template, TemplateError, rekey
from kernel_pool.backends.docker._template import restore as restore_template
from kernel_pool.backends.docker._tree import load_files
from kernel_pool.config import Profile, parse_size
from kernel_pool.exceptions import BackendError

logger = logging.getLogger(__name__)

KERNEL_COMMAND = ("python", "-P", "-m", "replgate_kernel", "-f")
"""``-P``: the working directory (the workspace) is not on sys.path while the kernel starts.
The per-output cap (``--max-output-bytes``) goes before ``-f``, in the command line, where the
session's code cannot raise it for the host (which applies its own caps anyway)."""
KERNEL_REKEY_TIMEOUT_S = 10.0


def service_env(profile: Profile) -> dict[str, str] | None:
    """The launch's variables that have the kernel's launcher start the profile's service and
    wait until it is ready before the kernel answers (``replgate_kernel/service.py``); None
    when the profile has none. A code context's kernel never gets them."""
    if not (profile.start_cmd or profile.ready_cmd):
        return None
    return {"REPLGATE_START_CMD": profile.start_cmd or "",
            "REPLGATE_READY_CMD": profile.ready_cmd or "",
            "REPLGATE_READY_WITHIN_S": f"{profile.ready_timeout_s:g}"}


class SandboxLaunch(DockerSandboxBase):
    """Starting a sandbox's kernel: restored from a template, started by the container's
    PID 1 (runc) or by ``docker exec`` (gVisor), and its connection file."""

    async def launch_kernel(self) -> dict[str, Any]:
        await self._ensure_running()
        self._close_pidfd()
        fresh, self.fresh, self.from_template = self.fresh, False, False
        if not fresh:  # a restart in the running container: every process of it ended
            await self._new_boot()
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
        config = kernel_connection(secrets.token_hex(32), f"{KERNEL_DIR}/{name}")
        await in_thread(self._write_connection_file, name, config, previous)
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
        config = kernel_connection(secrets.token_hex(32), f"{KERNEL_DIR}/{name}")
        await in_thread(self._write_connection_file, name, config, self.info.kernel_name)
        work = self._backend.template_work / self.info.sandbox_id
        if template.files is not None:  # CRIU reopens the service's files there by path
            await in_thread(load_files, self._init_pid, self.info.container_id, template.files)
        took = await in_thread(restore_template, template, self._init_pid,
                               self.info.container_id, work)
        logger.debug("sandbox %s: kernel restored from the template in %.3f s",
                     self.info.sandbox_id, took)
        await in_thread(request_adoption, self._socket_dir, name, template.kernel_pid)
        # A PID 1 gone meanwhile adopts nothing: the wait below says so.
        signal_init_process(self._init_pid, self.info.container_id, signal.SIGUSR1)
        self.info.kernel_name = name
        await self._watch_init_child(name, PID_WAIT_S)
        if self.info.kernel_ref is None:
            raise TemplateError("the container's PID 1 did not adopt the restored kernel")
        host = {**config, "ip": str(self._socket_dir / name)}
        await rekey(host, template.key, KERNEL_REKEY_TIMEOUT_S)
        self.from_template = True
        return host

    async def _launch_through_init(self, name: str) -> None:
        # Written once: a container remade below reads it as it starts (so a second request
        # would start a second kernel), and a signal without a request does nothing.
        async def signal_init() -> None:
            for attempt in range(3):
                try:
                    await self._wake_init()
                    return
                except BackendError:  # stopped or removed since it was checked: remake it
                    if attempt == 2 or await self._running():
                        raise
                    await self._ensure_running()

        self.info.kernel_name = name
        self._keep_init_child(*await self._ask_init(name, "python", service_env(self.profile),
                                                    signal_init))

    async def start_by_init(self, name: str, language: str,
                            env: dict[str, str]) -> tuple[int | None, int | None]:
        """Have PID 1 start a code context's kernel of ``language``, named ``name``, with
        ``env`` over the container's environment: (its host pid, None), or (None, its exit
        code) when it did not start."""
        if not process_alive(self._init_pid):
            raise BackendError("the session's container is not running")

        pid, code = await self._ask_init(name, language, env, self._wake_init)
        return (pid, None) if pid is not None else (None, code if code is not None else -1)

    async def _wake_init(self) -> None:
        """Send PID 1 the SIGUSR1 that has it read its requests: from the host where it can
        (see signal_init_process), else by the engine (a remote one, a gateway not root),
        whose refusal (a container stopped or removed) raises BackendError."""
        if not signal_init_process(self._init_pid, self.info.container_id, signal.SIGUSR1):
            await call_engine(self._api.kill, self.info.container_id, "SIGUSR1")

    async def _ask_init(self, name: str, language: str, env: dict[str, str] | None,
                        signal_init: Callable[[], Awaitable[None]],
                        ) -> tuple[int | None, int | None]:
        """Write the request for kernel ``name``, signal PID 1 by ``signal_init`` and wait
        for the kernel: (host pid, exit code) as :func:`find_kernel` answers. One request at
        a time: PID 1 reads one file."""
        async with self._launching:
            await in_thread(request_kernel, self._socket_dir, name,
                            self.profile.caps.display_bytes, language, env)
            await signal_init()
            return await in_thread(find_kernel, self._socket_dir, name, self._init_pid,
                                   PID_WAIT_S)

    async def _launch_by_exec(self, name: str) -> None:
        for attempt in range(3):
            try:
                # Its standard error while it starts in /kernel/<name>.err, as PID 1 gives
                # it under runc (``exec``: the shell's pid is the kernel's; the shell's own
                # PWD is not the kernel's environment).
                exec_id = (await call_engine(
                    self._api.exec_create, self.info.container_id,
                    ["/bin/sh", "-c", 'unset PWD; exec "$@" 2>"$0"', f"{KERNEL_DIR}/{name}.err",
                     *KERNEL_COMMAND[:-1],
                     f"--max-output-bytes={self.profile.caps.display_bytes}",
                     KERNEL_COMMAND[-1], f"{KERNEL_DIR}/{name}.json"],
                    user=f"{SANDBOX_UID}:{SANDBOX_GID}", workdir=SANDBOX_PATH,
                    environment=service_env(self.profile), stdout=False, stderr=False))["Id"]
                await call_engine(self._api.exec_start, exec_id, detach=True)
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

    async def start_errors(self) -> str | None:
        if not self.info.kernel_name:
            return None
        return await in_thread(start_errors, self._socket_dir, self.info.kernel_name)

    async def connection_info(self) -> dict[str, Any] | None:
        if not self.info.kernel_name or await self.poll() is not None:
            return None
        path = self._socket_dir / f"{self.info.kernel_name}.json"
        config = await in_thread(read_connection_file, path)
        return {**config, "ip": str(self._socket_dir / self.info.kernel_name)}

    def _write_connection_file(self, name: str, config: dict[str, Any],
                               previous: str | None) -> None:
        if previous:
            for stale in self._socket_dir.glob(f"{previous}*"):
                stale.unlink(missing_ok=True)
        # PID 1's records of earlier kernels (one may land after the glob above: it records
        # a kernel's end once it reaps it), so they never fill the small folder.
        for pattern in ("k*.pid", "k*.exit", "k*.err"):
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
            details = await call_engine(self._api.exec_inspect, exec_id)
            if details.get("Pid") or not details.get("Running"):
                break
            await asyncio.sleep(0.02)
        pid = int(details.get("Pid") or 0)
        if not details.get("Running") or not pid:
            self._exit_code = int(details.get("ExitCode") or -1)
            return
        self._open_pidfd(pid)
