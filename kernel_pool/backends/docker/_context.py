"""A code context's kernel in a Docker sandbox: one more kernel beside the session's own.

The container's PID 1 starts it (``init.py``, as the session's kernel: its ``KERNELS`` table is
the one list of kernel commands), as the sandbox's user, in its workspace, with the session's
environment, and binds its sockets in the same socket folder under a name of its own
(``x<hex>k<n>``, a new ``n`` each start, which nothing of the session's kernel globs). Asking
PID 1 takes a file and a signal, where ``docker exec`` took three calls to the engine and runc's
own start. The kernel leads its own process group and session, so a signal to the group reaches
its children too (R's ``system()``), and a hard stop kills the group and every descendant.

A memory pause dumps the contexts' kernels with the rest of the container (the engine's dump:
a dump of the session kernel's tree alone would not hold them), their records beside the
session kernel's; the restore finds them again, and :meth:`DockerContextSandbox.adopt` gives
each one's face the kernel that came back. The session's sandbox spares their processes when
it kills what a Python execution left behind.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import functools
import json
import os
import secrets
import signal
import time
from pathlib import Path
from typing import Any, Protocol

from kernel_pool._languages import KERNEL_LANGUAGES
from kernel_pool._sandbox_image import context_dir
from kernel_pool._workspace import Workspace
from kernel_pool.backends.base import CgroupUsage, Sandbox, SandboxInfo
from kernel_pool.backends.docker._docker import KERNEL_DIR, in_thread, kernel_connection
from kernel_pool.backends.docker._freezer import Freezer
from kernel_pool.backends.docker._init_kernel import exit_code, start_errors, write_for_sandbox
from kernel_pool.backends.docker._strays import kill_tree, pidfd_exited
from kernel_pool.exceptions import BackendError

EXIT_RECORD_WAIT_S = 1.0
"""How long PID 1 may take to record the exit of a kernel that ended (it reaps, then writes)."""


@functools.cache
def kernel_commands() -> dict[str, tuple[str, ...]]:
    """Each language's kernel command, as ``init.py`` in the image runs it (its source is
    what the image's tag hashes, so the two cannot differ)."""
    source = (context_dir() / "replgate_kernel" / "init.py").read_text()
    for node in ast.parse(source).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "KERNELS"):
            table: dict[str, tuple[str, ...]] = ast.literal_eval(node.value)
            return table
    raise BackendError("init.py names no KERNELS table")


class ContextParent(Protocol):
    """What a context's face uses of the session's sandbox (a
    :class:`~kernel_pool.backends.docker.DockerSandbox`, which makes the faces)."""

    info: SandboxInfo
    workspace: Workspace
    languages: tuple[str, ...]
    context_pids: set[int]
    """Host pids of the contexts' kernels running now, which its clean-up spares."""

    @property
    def procs_file(self) -> Path | None:
        """The container's cgroup list of processes, once it runs under runc."""

    @property
    def freezer(self) -> Freezer | None:
        """The container's cgroup freezer, where the host lets it be written."""

    async def start_by_init(self, name: str, language: str,
                            env: dict[str, str]) -> tuple[int | None, int | None]:
        """Have PID 1 start kernel ``name``: (host pid, None) or (None, exit code)."""

    def context_ended(self, face: DockerContextSandbox) -> None:
        """``face``'s kernel was removed for good."""

    async def usage(self) -> CgroupUsage:
        """The container's use (one cgroup for all its kernels)."""

    async def reset_peak_memory(self) -> bool:
        """Restart the container's peak-memory reading."""

    async def kill_strays(self, keep_kernel_children: bool = True) -> int:
        """Kill what executions left behind, every kernel spared."""


class DockerContextSandbox(Sandbox):
    """One context's kernel in the container of ``parent``: the sandbox face a
    :class:`~kernel_pool._kernel.Kernel` drives, reaching that kernel alone."""

    def __init__(self, parent: ContextParent, language: str, name: str,
                 env: dict[str, str]) -> None:
        self._parent = parent
        self.language = language
        self.name = name
        self.env = dict(env)
        self.info = parent.info.model_copy(update={"kernel_name": name, "kernel_ref": None})
        self.workspace = parent.workspace
        self.languages = parent.languages
        self._pid = 0
        self._pidfd: int | None = None
        self._exit_code: int | None = None
        self._launches = 0
        self.key = ""
        """Its kernel's connection key, as the host made it (the sandbox can rewrite the
        connection file): a checkpoint records it."""
        self._adopted: dict[str, Any] | None = None
        """The connection of a kernel restored with the sandbox, taken by the next launch."""
        # Deno's and JJava's kernels are their relay's child, bash_kernel's shell its child
        # (pexpect's): both levels are spared by a clean-up (a killed shell made the next
        # execution "Restarting Bash" without running its code).
        self._kernel_levels = 2 if language == "bash" or KERNEL_LANGUAGES[language].relayed \
            else 1

    @property
    def _socket_dir(self) -> Path:
        return Path(self._parent.info.socket_dir)

    @property
    def pid(self) -> int:
        """The host pid of its kernel while one runs (0: none)."""
        return self._pid

    def adopt(self, kernel_name: str, pid: int, config: dict[str, Any]) -> None:
        """Take the kernel a restore from a memory image brought back (``pid`` on the host):
        the next launch connects to it instead of starting one."""
        self._forget()
        self._launches = int(kernel_name.rsplit("k", 1)[1])
        self.info.kernel_name, self.key = kernel_name, config["key"]
        self._adopted = config
        self._hold(pid)  # gone already: its launch finds it dead

    async def launch_kernel(self) -> dict[str, Any]:
        if self._adopted is not None:
            config, self._adopted = self._adopted, None
            if not self._pid:
                raise BackendError("its kernel was restored with the sandbox, then ended")
            return config
        if kernel_commands().get(self.language) is None:
            raise BackendError(f"the sandbox image has no {self.language} kernel")
        self._forget()
        self._launches += 1
        name = f"{self.name}k{self._launches}"
        config = kernel_connection(secrets.token_hex(32), f"{KERNEL_DIR}/{name}")
        await in_thread(self._write_connection_file, name, config)
        self.info.kernel_name, self.info.kernel_ref, self.key = name, None, config["key"]
        pid, code = await self._parent.start_by_init(name, self.language, self.env)
        if pid is None:
            self._exit_code = code
        elif not self._hold(pid):
            self._exit_code = -1  # gone already
        return {**config, "ip": str(self._socket_dir / name)}

    async def start_errors(self) -> str | None:
        if not self.info.kernel_name:
            return None
        return await in_thread(start_errors, self._socket_dir, self.info.kernel_name)

    def _hold(self, pid: int) -> bool:
        """Watch host process ``pid`` as this face's kernel (a pidfd for its exit, spared by
        the parent's clean-up); False if it is gone already."""
        try:
            self._pidfd = os.pidfd_open(pid)
        except OSError:
            return False
        self._pid = pid
        self.info.kernel_ref = str(pid)
        self._parent.context_pids.add(pid)
        return True

    def _write_connection_file(self, name: str, config: dict[str, Any]) -> None:
        # Earlier starts' files, and whatever the sandbox planted at this kernel's names.
        self._remove_files()
        write_for_sandbox(self._socket_dir / f"{name}.json", json.dumps(config))

    def _forget(self) -> None:
        """Drop the handle on the previous kernel (its pidfd, its pid spared by the parent)."""
        self._parent.context_pids.discard(self._pid)
        if self._pidfd is not None:
            os.close(self._pidfd)
        self._pid, self._pidfd, self._exit_code = 0, None, None

    def _exited(self) -> bool:
        return self._pidfd is None or pidfd_exited(self._pidfd)

    async def poll(self) -> int | None:
        if self._exit_code is not None:
            return self._exit_code
        if not self._exited():
            return None
        return await self._read_exit_code()

    async def _read_exit_code(self) -> int:
        code: int | None = None
        name = self.info.kernel_name
        deadline = time.monotonic() + EXIT_RECORD_WAIT_S
        while name and code is None and time.monotonic() < deadline:
            code = await in_thread(exit_code, self._socket_dir, name)
            if code is None:
                await asyncio.sleep(0.02)
        self._exit_code = code if code is not None else -signal.SIGKILL
        return self._exit_code

    async def wait(self) -> int:
        fd = self._pidfd
        if fd is not None and self._exit_code is None:
            loop = asyncio.get_running_loop()
            exited: asyncio.Future[None] = loop.create_future()
            loop.add_reader(fd, lambda: None if exited.done() else exited.set_result(None))
            try:
                await exited
            finally:
                loop.remove_reader(fd)
        code = await self.poll()
        return code if code is not None else -1

    async def send_signal(self, signum: int) -> None:
        """``signum`` to the kernel's process group (it leads one: an exec'd process does)."""
        if self._pidfd is None or self._exited():
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            # The pidfd, not readable, holds the pid: it names this kernel still.
            os.killpg(self._pid, signum)

    async def kill(self, restart: bool = False) -> None:
        """Kill the kernel, its group and every descendant (nothing else of the sandbox)."""
        procs = self._parent.procs_file
        if self._pid and procs is not None:
            await in_thread(kill_tree, procs, self._pid, 0, self._parent.freezer)
        elif self._pidfd is not None and not self._exited():
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    async def cleanup(self, restart: bool = False) -> None:
        self._forget()
        if not restart:
            self._parent.context_ended(self)
            await in_thread(self._remove_files)

    def _remove_files(self) -> None:
        for path in self._socket_dir.glob(f"{self.name}k*"):
            with contextlib.suppress(OSError):
                path.unlink()

    async def usage(self) -> CgroupUsage:
        return await self._parent.usage()  # one cgroup: the session's limits cover them all

    async def reset_peak_memory(self) -> bool:
        return await self._parent.reset_peak_memory()

    async def kill_strays(self, keep_kernel_children: bool = True) -> int:
        """After a cut execution (timeout, interrupt), this kernel's own descendants; then
        what any execution left re-parented to PID 1 (the parent's clean-up, which spares
        every kernel of the sandbox and its children)."""
        killed = 0
        procs = self._parent.procs_file
        if not keep_kernel_children and self._pid and procs is not None:
            killed = await in_thread(kill_tree, procs, self._pid,
                                    self._kernel_levels, self._parent.freezer)
        return killed + await self._parent.kill_strays(keep_kernel_children=True)

    async def reserve(self) -> None:
        return None  # the session's sandbox runs: nothing was given back

    async def release(self) -> None:
        return None
