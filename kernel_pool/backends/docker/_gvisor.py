"""The gVisor runtime (``runsc``) for the Docker backend: what the engine must offer, and the
sandbox's processes, seen and killed from the host through gVisor's own control.

Under gVisor the sandboxed processes are not host processes: the container's cgroup holds the
gVisor kernel (the sentry), its file proxy (the gofer) and their helper processes, and killing
any of those kills the whole sandbox. So the per-execution clean-up asks the sentry for its
process table over its control socket (what ``runsc ps`` does, without starting runsc: a
fraction of a millisecond, see _gvisor_control) and, when an execution left processes behind,
pauses the sandbox (``runsc pause``'s call: every task stops where it stands, a fork bomb's
included, so none forks while the others are killed), kills them one by one (``runsc kill
--pid``'s call; a paused task dies when it resumes), resumes it and waits for them to be gone.
All from the host: no ``docker exec`` (which a sandbox at its process limit leaves no room
for) and nothing the sandboxed code can intercept. The hard stop of a restart, and the
clean-up when the sandbox cannot be paused and resumed, replace the whole container instead:
gVisor's kernel goes with it, and the workspace stays.

gVisor's process ids are handed out in increasing order and not reused until the space wraps,
so a pid read from the process table and killed a moment later is the same process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import anyio.to_thread

from kernel_pool.backends.base import CgroupUsage
from kernel_pool.backends.docker._gvisor_control import ControlError, SandboxControl
from kernel_pool.backends.docker._gvisor_table import kernel_descendants, strays_of
from kernel_pool.config import Profile

logger = logging.getLogger(__name__)

ENGINE_RUNTIMES = {"runc": "runc", "gvisor": "runsc"}
"""A profile's ``runtime`` -> the name the Docker engine knows the OCI runtime by."""
GVISOR_ARGS = ("--network=none", "--host-uds=create")
"""runsc arguments the engine must pass: no network stack of its own (the sandbox has no network
anyway, and runsc cannot set one up in an engine's root network namespace), and Unix sockets
bound in the sandbox made visible on the host (the kernel's ZMQ sockets in the bind-mounted
socket folder; without it they never appear on the host)."""
RUNSC_PATH = "/usr/local/bin/runsc"
"""Where ``./run.sh`` installs Debian's runsc."""
DAEMON_JSON = (f'"runtimes": {{"runsc": {{"path": "{RUNSC_PATH}", "runtimeArgs": '
               f'{json.dumps(list(GVISOR_ARGS))}}}}}')
HOST_PIDS_HEADROOM = 128
"""Host processes and threads the sentry and gofer may use beyond two per sandboxed task."""
RUNSC_TIMEOUT_S = 10.0
ROUNDS = 3
"""Passes of pause-ps-kill-resume at most: paused, one finds everything (a second, nothing)."""
SETTLE_S = 0.1
"""How long the reap waits before it looks again at processes new under the kernel: the tree
must hold still this long (under gVisor a fork bomb's first shell still ran when a 5 ms
execution's reap looked, and a double fork's middle process living 40 ms outlasted a 50 ms
wait in 1 run of 4)."""
SETTLES = 5
"""Looks again at most (half a second), for a tree that keeps changing."""
GONE_WAIT_S = 5.0
"""How long the clean-up waits for the processes it killed to be gone once resumed."""
OOM_POLL_S = 0.5
"""How often a waiting gVisor kernel's cgroup is read for an out-of-memory kill."""
STUCK_SHARE = 0.9
"""Memory still at this share of the limit after an OOM kill: nothing was freed (see
:class:`OutOfMemoryWatch`)."""


def host_pids_limit(profile: Profile) -> int:
    """The host cgroup's pids ceiling for a gVisor sandbox.

    The profile's ``pids`` is enforced inside gVisor (``RLIMIT_NPROC``: its fork and clone fail
    with EAGAIN, as on Linux). The host cgroup's limit only bounds the sentry, which needs host
    threads and helper processes for the sandbox's tasks; hitting it crashes the sentry (the
    whole sandbox), so it sits well above what ``pids`` sandboxed tasks need (measured: 256
    tasks cost about 300 host pids).
    """
    return 2 * profile.pids + HOST_PIDS_HEADROOM


def missing_runtime(runtimes: Mapping[str, Any], profiles: Iterable[Profile]) -> str | None:
    """The one sentence to fail start-up with when a profile asks for gVisor and the engine
    (its ``docker info`` ``Runtimes``) does not offer it as needed; None when all is well."""
    wanting = sorted(p.name for p in profiles if p.runtime == "gvisor")
    if not wanting:
        return None
    registered = runtimes.get(ENGINE_RUNTIMES["gvisor"])
    arguments = set(registered.get("runtimeArgs") or []) if isinstance(registered, dict) else set()
    if registered is not None and arguments >= set(GVISOR_ARGS):
        return None
    problem = ("has no runtime named runsc" if registered is None else
               f"runs runsc without {' '.join(sorted(set(GVISOR_ARGS) - arguments))}")
    # the default profile's runtime is a setting, the others' are the policy file's
    named = ", ".join(f"{name} (REPLGATE_RUNTIME)" if name == "default" else name
                      for name in wanting)
    return (f"profile {named} asks for runtime gvisor but the Docker engine "
            f"{problem}: add {DAEMON_JSON} to /etc/docker/daemon.json (runsc from Debian's "
            "package; ./run.sh installs it and does this when it starts the engine) and reload "
            "the engine with `kill -HUP $(pidof dockerd)`")


class Runsc:
    """One gVisor sandbox's processes, seen and killed from the host: through its control
    socket (a fraction of a millisecond a call), else through the runsc that runs it (a
    process started per call, 20-50 ms: for a runsc whose socket is elsewhere)."""

    def __init__(self, binary: str, root: str, container_id: str,
                 control: SandboxControl | None = None, sandbox_pid: int = 0) -> None:
        self.binary = binary
        self.root = root
        self.container_id = container_id
        self.sandbox_pid = sandbox_pid
        """The host pid of the sandbox process (gVisor's kernel), where known."""
        self._control: SandboxControl | None = control or SandboxControl(root, container_id)
        self._kept: set[int] = set()
        """The kernel's descendants the last reap left running (see :meth:`kill_strays`)."""
        """None once runsc answered where the socket did not (it keeps it elsewhere)."""

    @classmethod
    def for_sandbox(cls, sandbox_pid: int, container_id: str) -> Runsc | None:
        """Found from the sandbox process (the container's PID as the engine reports it):
        its executable and the ``--root`` the engine gave it. None where that is not
        readable (a remote engine, no root)."""
        try:
            binary = str(Path(f"/proc/{sandbox_pid}/exe").readlink())
            arguments = Path(f"/proc/{sandbox_pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        for argument in arguments:
            if argument.startswith(b"--root="):
                return cls(binary.removesuffix(" (deleted)"), argument[7:].decode(), container_id,
                           sandbox_pid=sandbox_pid)
        return None

    def end_sandbox(self) -> bool:
        """SIGKILL to the sandbox process, gVisor's kernel: every sandboxed process ends with
        it at once, whatever it does, and the engine's removal that follows has nothing left
        to stop (a paused sandbox took the engine 10 s to remove, a sandbox of a hundred
        processes over a minute in CI; 0.3 s once ended). Whether it was signalled."""
        if not self.sandbox_pid:
            return False
        try:
            pidfd = os.pidfd_open(self.sandbox_pid)
        except OSError:
            return False  # ended already
        try:
            # Checked once the pidfd holds the process: a pid reused since is not signalled.
            arguments = Path(f"/proc/{self.sandbox_pid}/cmdline").read_bytes().split(b"\0")
            if arguments[0] != b"runsc-sandbox" or self.container_id.encode() not in arguments:
                return False
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            return True
        except OSError:
            return False
        finally:
            os.close(pidfd)

    def _call(self, *arguments: str) -> subprocess.CompletedProcess[str] | None:
        """A runsc command's outcome; None when it failed or did not end in time."""
        try:
            result = subprocess.run([self.binary, f"--root={self.root}", *arguments],
                                    capture_output=True, text=True, timeout=RUNSC_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return result if result.returncode == 0 else None

    def _ps(self) -> dict[int, int] | None:
        result = self._call("ps", self.container_id)
        if result is None:
            return None
        found = {}
        for line in result.stdout.splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 3 and fields[1].isdigit() and fields[2].isdigit():
                found[int(fields[1])] = int(fields[2])
        return found

    async def processes(self) -> dict[int, int] | None:
        """pid -> parent pid of every process in the sandbox, as gVisor numbers them; None
        when neither the socket nor runsc answers (the sandbox is gone)."""
        control = self._control
        if control is None:
            return await anyio.to_thread.run_sync(self._ps)
        try:
            return await control.processes(self.container_id)
        except ControlError as exc:
            found = await anyio.to_thread.run_sync(self._ps)
            if found is not None:  # runsc answers where the socket did not: it keeps it elsewhere
                logger.info("gVisor sandbox %s: using runsc, not its control socket (%s)",
                            self.container_id[:12], exc)
                self._control = None
            return found

    async def kill(self, pid: int) -> bool:
        """SIGKILL to one of the sandbox's processes; whether it was delivered."""
        if self._control is not None:
            try:
                await self._control.kill(self.container_id, pid)
                return True
            except ControlError:
                return False  # gone since it was listed (the socket answered the listing)
        result = await anyio.to_thread.run_sync(
            self._call, "kill", "--pid", str(pid), self.container_id, "KILL")
        return result is not None

    def _ps_named(self, name: str) -> list[int] | None:
        # runsc ps: UID PID PPID C TTY STIME TIME CMD
        result = self._call("ps", self.container_id)
        if result is None:
            return None
        return [int(fields[1]) for fields in map(str.split, result.stdout.splitlines()[1:])
                if len(fields) >= 8 and fields[1].isdigit() and fields[2] == "0"
                and fields[-1] == name]

    async def signal_exec(self, name: str, signum: int) -> bool:
        """``signum`` to the process the engine started that took the name ``name`` (a
        terminal command's wrapper: runsc forwards a signal sent to its exec to the terminal's
        foreground group instead); whether it reached one."""
        delivered = False
        if self._control is not None:
            try:
                pids = await self._control.execs_named(self.container_id, name)
            except ControlError:
                pass  # no socket there: through runsc below
            else:
                for pid in pids:
                    with contextlib.suppress(ControlError):  # ended meanwhile
                        await self._control.kill(self.container_id, pid, signum)
                        delivered = True
                return delivered
        for pid in await anyio.to_thread.run_sync(self._ps_named, name) or []:
            delivered |= await anyio.to_thread.run_sync(
                self._call, "kill", "--pid", str(pid), self.container_id,
                str(int(signum))) is not None
        return delivered

    async def pause(self) -> bool:
        """Stop every task of the sandbox; whether it did (then :meth:`resume` must follow)."""
        if self._control is not None:
            try:
                await self._control.pause()
                return True
            except ControlError:
                return False
        return await anyio.to_thread.run_sync(self._call, "pause", self.container_id) is not None

    async def resume(self) -> bool:
        """End :meth:`pause`; whether it did (else the sandbox stays stopped)."""
        if self._control is not None:
            try:
                await self._control.resume()
                return True
            except ControlError:
                return False
        return await anyio.to_thread.run_sync(self._call, "resume", self.container_id) is not None

    async def kill_strays(self, keep_kernel_children: bool,
                          spared: frozenset[int] = frozenset()) -> int | None:
        """Kill every process but PID 1 and the processes the engine started (parent 0: the
        kernel), and with ``keep_kernel_children`` their descendants, and wait until they are
        gone; how many were killed.

        The usual case, nothing to kill, is one look at the process table. Otherwise each pass
        pauses the sandbox, so that a fork bomb cannot re-fork while it is killed. Processes
        new under the kernel since the last reap are looked at again, :data:`SETTLE_S` later,
        until the kernel's tree holds still: one of them may have been about to exit (a double
        fork's middle process, a fork bomb's first shell), its children then re-parented to
        PID 1, strays the first look could not see. None when the sandbox could not be paused
        or resumed, or its table read (neither the socket nor runsc answered), or strays were
        left after the last pass: the caller replaces it. ``spared`` (the profile's service) and
        their descendants are never killed.
        """
        killed: set[int] = set()
        passes = looks = 0
        while True:
            found = await self.processes()
            if found is None:
                return None  # unreadable: what runs there is unknown, and may be a bomb
            if [p for p in strays_of(found, keep_kernel_children, spared) if p not in killed]:
                if passes == ROUNDS or not await self._kill_paused(killed, keep_kernel_children,
                                                                    spared):
                    return None
                passes += 1
                continue
            kept = kernel_descendants(found) if keep_kernel_children else set()
            settled = kept <= self._kept or looks == SETTLES
            self._kept = kept
            if settled:
                return len(killed)
            looks += 1
            await anyio.sleep(SETTLE_S)

    async def _kill_paused(self, killed: set[int], keep_kernel_children: bool,
                           spared: frozenset[int]) -> bool:
        """One pass: pause, kill the strays (adding them to ``killed``), resume, wait for them
        to be gone; False when the sandbox could not be paused or resumed."""
        if not await self.pause():
            return False
        try:
            # Paused: the table read now is complete, and stays so while it is killed.
            found = await self.processes()
            for pid in strays_of(found or {}, keep_kernel_children, spared):
                if pid not in killed and await self.kill(pid):
                    killed.add(pid)
        finally:
            resumed = await self.resume()
        if not resumed:
            return False
        await self._wait_gone(killed)
        return True

    async def _wait_gone(self, killed: set[int]) -> None:
        """Wait until the killed processes have left the table (reaped), at most
        :data:`GONE_WAIT_S`. Those whose parent the engine started (the kernel's children,
        after a timeout) are not waited for: they stay listed until it reaps them."""
        deadline = anyio.current_time() + GONE_WAIT_S
        while anyio.current_time() < deadline:
            found = await self.processes()
            if found is None:
                return
            roots = {pid for pid, parent in found.items() if parent == 0} - {1}
            if not any(pid in found and found[pid] not in roots for pid in killed):
                return
            await anyio.sleep(0.005)

    async def kill_all_but_init(self) -> bool:
        """SIGKILL to every process but PID 1 (the kernel, commands, their children); False
        when the process table cannot be read."""
        found = await self.processes()
        if found is None:
            return False
        for pid in found:
            if pid != 1:
                await self.kill(pid)
        return True


class OutOfMemoryWatch:
    """Tells when an out-of-memory kill has left a gVisor sandbox stuck.

    Under runc the host's OOM killer kills the biggest sandboxed process, the kernel, whose
    death is then reported with the reason. Under gVisor the processes it sees are gVisor's:
    it kills the host-side helper of the biggest sandboxed address space, and gVisor may leave
    that sandboxed process hung, holding its memory at the limit, until a timeout's hard stop
    (measured: a kernel filling 384 MiB hangs after one OOM kill, at 99% of the limit, using
    no CPU). So: the cgroup's OOM count rose, and one reading later the memory is still at the
    limit (gVisor did not end the process itself, as it does a lone process): stuck.
    """

    def __init__(self, limit_bytes: int, oom_kills: int) -> None:
        self.limit_bytes = limit_bytes
        self.at_start = oom_kills
        """The cgroup's OOM count when the kernel started."""
        self.seen = oom_kills
        self._pending = False

    def stuck(self, usage: CgroupUsage) -> bool:
        """Fed one reading per :data:`OOM_POLL_S`; True once for each stuck OOM kill."""
        if usage.oom_kills is not None and usage.oom_kills > self.seen:
            self.seen = usage.oom_kills
            self._pending = True  # one reading's time for gVisor to end the process itself
            return False
        if not self._pending:
            return False
        self._pending = False
        return usage.memory_bytes is not None and (
            usage.memory_bytes >= STUCK_SHARE * self.limit_bytes)
