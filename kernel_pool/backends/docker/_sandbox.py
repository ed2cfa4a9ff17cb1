"""A Docker sandbox (:class:`DockerSandbox`): one container, its kernel watched, signalled and
killed, the processes it leaves behind killed, its use read, its code contexts' kernels made.

Its kernel's start is :mod:`._sandbox_launch`, its memory image :mod:`._sandbox_checkpoint`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import signal
from pathlib import Path

import docker
import docker.errors
import requests.exceptions

from kernel_pool._disk import SANDBOX_GID, SANDBOX_UID
from kernel_pool._workspace import SANDBOX_PATH
from kernel_pool.backends.base import CgroupUsage, CommandProcess, Sandbox
from kernel_pool.backends.docker._commands import WATCHER, DockerCommand
from kernel_pool.backends.docker._context import DockerContextSandbox
from kernel_pool.backends.docker._criu import RUNC_CRIU_CONFIG
from kernel_pool.backends.docker._docker import KERNEL_DIR, call_engine, in_thread
from kernel_pool.backends.docker._freezer import Freezer
from kernel_pool.backends.docker._fsop import start_file_op
from kernel_pool.backends.docker._gvisor import OOM_POLL_S
from kernel_pool.backends.docker._gvisor_table import service_of
from kernel_pool.backends.docker._init_kernel import exit_code
from kernel_pool.backends.docker._sandbox_checkpoint import SandboxCheckpoints
from kernel_pool.backends.docker._sandbox_launch import SandboxLaunch
from kernel_pool.backends.docker._strays import (
    GONE_WAIT_S,
    find_strays,
    kill_strays,
    pidfd_exited,
    process_alive,
    session_leaders_below,
    still_running,
    wait_gone,
)
from kernel_pool.exceptions import BackendError

logger = logging.getLogger(__name__)

OOM_RECORD_WAITS = 30
"""Tenths of a second to wait for the engine's record of a gVisor sandbox's death."""
# Sandboxed code runs as this user; PID 1 is spared by kill(-1), so the container survives.
KILL_ALL = ["/bin/sh", "-c", "kill -KILL -1"]


class DockerSandbox(SandboxLaunch, SandboxCheckpoints):
    """One container; its PID 1 starts each kernel (``docker exec`` does under gVisor)."""

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

    async def poll(self) -> int | None:
        if self._exit_code is not None:
            return self._exit_code
        if not self.info.kernel_ref:
            return -1
        if self._through_init:
            return await self._poll_init_child()
        try:
            details = await in_thread(self._api.exec_inspect, self.info.kernel_ref)
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
            if not pidfd_exited(self._pidfd):
                return None
        elif self._pid and process_alive(self._pid):
            return None
        if not process_alive(self._init_pid):
            # The container stopped (removed, or its init killed): the kernel died with it
            # and nothing reaped it to record a status.
            self._exit_code = -signal.SIGKILL
            return self._exit_code
        name = self.info.kernel_name or ""
        code = await in_thread(exit_code, self._socket_dir, name)
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
                state = (await call_engine(self._api.inspect_container,
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
            await self._remove_container()

    async def send_signal(self, signum: int) -> None:
        if self._pidfd is not None:
            signal.pidfd_send_signal(self._pidfd, signum)
        elif self._pid:
            await call_engine(self._api.exec_create, self.info.container_id,
                              ["/bin/sh", "-c", f"kill -{signum} -1"], user=f"{SANDBOX_UID}")

    async def kill(self, restart: bool = False) -> None:
        if restart and self.profile.runtime == "gvisor":
            # The cgroup holds gVisor's own processes, not the sandboxed ones: the hard stop
            # replaces the container (a fresh gVisor kernel; launch_kernel makes it, the
            # workspace stays), which no swarm of processes inside can slow down.
            await self._remove_container()
            return
        if restart:
            procs = self._cgroup.procs_file if self._cgroup is not None else None
            if procs is not None and self._init_pid and procs.exists():
                # From the host, through the container's cgroup: this needs no new process in
                # the container, which a fork bomb at the pids limit leaves no room for.
                await in_thread(kill_strays, procs, self._init_pid, 0, False, (),
                                self._freezer)
                if not await in_thread(wait_gone, procs, self._init_pid):
                    # The next kernel must not meet them (their memory, their ports): it
                    # starts in a fresh container (launch_kernel makes it), as under gVisor.
                    logger.warning("sandbox %s: processes killed for a restart still run "
                                   "after %g s; replacing its container",
                                   self.info.sandbox_id, GONE_WAIT_S)
                    await self._remove_container()
                return
            try:
                exec_id = (await call_engine(self._api.exec_create, self.info.container_id,
                                             KILL_ALL, user=f"{SANDBOX_UID}:{SANDBOX_GID}"))["Id"]
                await call_engine(self._api.exec_start, exec_id)
            except BackendError:
                pass  # the container is gone: launch_kernel makes a new one
        else:
            await self._remove_container()

    async def cleanup(self, restart: bool = False) -> None:
        self._close_pidfd()
        if restart:
            return
        await self._end_before_removal()
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

    async def started(self) -> None:
        self._service = {}
        if not (self.profile.start_cmd or self.profile.ready_cmd):
            return
        if self._runsc is not None:
            found = await self._runsc.processes() or {}
            self._service = dict.fromkeys(service_of(found), 0)
        elif self._pid:
            # Pseudo-files: read on the loop (microseconds).
            self._service = session_leaders_below(self._pid)

    async def kill_strays(self, keep_kernel_children: bool = True) -> int:
        if self.profile.runtime == "gvisor":
            if self._runsc is None:
                return 0
            gone = await self._runsc.kill_strays(keep_kernel_children,
                                                 frozenset(self._service))
            if gone is None:  # not listed, paused or resumed: the kernel's death is then handled
                logger.warning("sandbox %s: processes may have outlived the execution and "
                               "could not be listed, or killed with the sandbox paused; "
                               "replacing it", self.info.sandbox_id)
                await self._remove_container()
                return 0
            return gone
        procs = self._cgroup.procs_file if self._cgroup is not None else None
        if procs is None or not self._pid or not self._init_pid:
            return 0
        spared = frozenset(self._commands | self.context_pids) | still_running(self._service)
        # Pseudo-files again: the usual case, nothing to kill, is found on the loop.
        if not find_strays(procs, self._init_pid, self._pid, keep_kernel_children, spared):
            return 0
        killed: int = await in_thread(kill_strays, procs, self._init_pid, self._pid,
                                      keep_kernel_children, spared, self._freezer)
        return killed

    @property
    def procs_file(self) -> Path | None:
        """The container's cgroup list of processes (host pids), once it runs under runc."""
        return self._cgroup.procs_file if self._cgroup is not None else None

    @property
    def freezer(self) -> Freezer | None:
        """The container's cgroup freezer (runc, and a host that lets it be written)."""
        return self._freezer

    # The freezer's file is a kernel pseudo-file: writing it is a system call answered in
    # microseconds, done on the loop so that a claim thaws in the pool's I/O-free step.
    def freeze_warm(self) -> bool:
        if self._freezer is None or self._warm_frozen:
            return self._warm_frozen
        self._warm_frozen = self._freezer.freeze_nowait()
        return self._warm_frozen

    def thaw_warm(self) -> None:
        if self._warm_frozen and self._freezer is not None:
            self._freezer.thaw()
        self._warm_frozen = False

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

    async def release(self) -> None:
        """The workspace is parked, and the socket folder's tmpfs unmounted (lazily: a
        listening egress socket may hold it until its proxy closes); ``reserve`` makes it."""
        await self.end_dumped_tree()  # before the workspace's park: no container holds it
        await super().release()
        await in_thread(self._backend.unmount_socket_dir, self._socket_dir)

    async def reserve(self) -> None:
        await super().reserve()
        await in_thread(self._backend.make_socket_dir, self._socket_dir)

    async def start_file_op(self, args: list[str], *, stdin: bool = False) -> CommandProcess:
        return await start_file_op(self._api, call_engine, self.info.container_id, args,
                                   running=self._commands, stdin=stdin)

    async def start_command(self, command: str, *, env: dict[str, str], cwd: str,
                            stdin: bool = False,
                            pty: tuple[int, int] | None = None) -> CommandProcess:
        folder = cwd if cwd.startswith("/") else f"{SANDBOX_PATH}/{cwd}".rstrip("/")
        signal_inside = None
        if pty is not None and self._runsc is not None:
            # runsc hands a signal sent to a terminal's exec to the terminal's foreground group
            # (the shell, which ignores SIGTERM), never to the wrapper, which ends the whole
            # session: the wrapper takes a name of its own, and is signalled by it.
            name = f"rg-{secrets.token_hex(6)}"
            env = {**env, "REPLGATE_NAME": name}
            signal_inside = functools.partial(self._runsc.signal_exec, name)
        return await DockerCommand.start(
            self._api, call_engine, self.info.container_id, command, env=env,
            cwd=folder, running=self._commands, stdin=stdin, pty=pty,
            signal_inside=signal_inside)

    async def start_watch(self, folder: str, recursive: bool) -> CommandProcess:
        # gVisor's inotify does not see what the host writes: the watcher rescans as well
        rescans = self.profile.runtime == "gvisor"
        argv = [*WATCHER, f"{SANDBOX_PATH}/{folder}".rstrip("/"), "1" if recursive else "0",
                "1" if rescans else "0"]
        return await DockerCommand.start(
            self._api, call_engine, self.info.container_id, "", env={}, cwd=SANDBOX_PATH,
            running=self._commands, argv=argv)
