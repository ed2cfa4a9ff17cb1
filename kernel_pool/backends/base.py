"""The container backend interface, in the shape of jupyter_client's kernel provisioners.

A :class:`SandboxBackend` makes sandboxes; a :class:`Sandbox` is one isolated container with
its workspace, in which kernels are launched, watched, signalled and killed much as
``subprocess.Popen`` does for a process. ``get_info``/``SandboxBackend.load`` let a restarted
gateway take a running sandbox back. Backends are found through the ``replgate.backends``
entry point group; Docker is registered there like any plugin.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import anyio.to_thread
from pydantic import BaseModel, Field

from kernel_pool._workspace import Workspace
from kernel_pool.config import PoolSettings, Profile
from kernel_pool.exceptions import BackendError


class SandboxSpec(BaseModel):
    """What to create: an id, a profile and the environment the caller asked for."""

    sandbox_id: str
    profile: Profile
    env: dict[str, str] = Field(default_factory=dict)


class SandboxInfo(BaseModel):
    """Everything needed to take a running sandbox back after a gateway restart."""

    sandbox_id: str
    backend: str
    profile: str
    container_id: str
    workspace: str
    socket_dir: str
    kernel_name: str | None = None
    kernel_ref: str | None = None
    """The backend's handle on the running kernel process (Docker: the exec id)."""


class CgroupUsage(BaseModel):
    """A reading of the sandbox's cgroup."""

    cpu_ns: int | None = None
    memory_bytes: int | None = None
    peak_memory_bytes: int | None = None
    oom_kills: int | None = None


class CommandProcess(ABC):
    """A shell command running in a sandbox beside the kernel (:meth:`Sandbox.start_command`)."""

    @abstractmethod
    async def read(self) -> tuple[str, bytes] | None:
        """The next piece of output as (``"stdout"`` or ``"stderr"``, bytes); None at the end."""

    @abstractmethod
    async def kill(self) -> None:
        """Stop the command and every process of its group."""

    @abstractmethod
    async def wait(self) -> int | None:
        """The exit status once the output has ended (None if it cannot be known)."""

    async def write(self, data: bytes) -> None:
        """Write to the command's stdin (or terminal); started with ``stdin`` or ``pty``."""
        raise BackendError("this backend cannot write to a command's input")

    async def close_input(self) -> None:
        """Close the command's stdin: it reads its end."""
        raise BackendError("this backend cannot close a command's input")

    async def resize(self, cols: int, rows: int) -> None:
        """Resize the command's terminal (started with ``pty``)."""
        raise BackendError("this backend cannot resize a command's terminal")

    async def close(self) -> None:
        """Release the connection to the command."""
        return None

    async def send_signal(self, signum: int) -> None:
        """Send ``signum`` to the process the backend started (not its group); nothing when
        it has ended."""
        return None


class Sandbox(ABC):
    """One isolated container with a workspace, hosting one kernel at a time (and those of
    the session's code contexts beside it, :meth:`add_kernel`)."""

    info: SandboxInfo
    workspace: Workspace
    languages: tuple[str, ...] = ("python",)
    """The languages its image offers (``kernel_pool._languages.offered``)."""
    boot_id: str | None = None
    """The boot id its own ``/proc/sys/kernel/random/boot_id`` shows, where the backend gives
    each sandbox one of its own: new at each boot (the sandbox made, its kernel restarted),
    kept across a pause (:meth:`resume_boot`). None where it does not set one (the id is
    then its host's, or its runtime kernel's, new at each start of that)."""

    @property
    def checkpoint_refusal(self) -> str | None:
        """Why this sandbox cannot be checkpointed where its backend could (its runtime, say),
        as a sentence; None when nothing of its own stands in the way. Asked before anything
        is disconnected for a :meth:`checkpoint`."""
        return None

    def context_refusal(self, language: str) -> str | None:
        """Why a :meth:`checkpoint` could not hold a code context's kernel of ``language``
        (:meth:`add_kernel`) where it can hold the sandbox, as a sentence; None if it can."""
        return None

    @property
    def pipe_folder(self) -> tuple[Path, str] | None:
        """A folder the host and the kernel both reach, where a named pipe the host makes
        carries a snapshot between them as it is written (the host's path, the sandbox's);
        None where a pipe cannot cross (a snapshot then passes through a workspace file)."""
        return None

    @abstractmethod
    async def launch_kernel(self) -> dict[str, Any]:
        """Start a kernel with a fresh key, the container first if it is gone.

        Returns the host-side connection info (jupyter_client's connection-file dict).
        """

    async def add_kernel(self, language: str, name: str, env: dict[str, str], *,
                         restored: bool = False) -> Sandbox:
        """The face of one more kernel in this sandbox (a code context): a :class:`Sandbox`
        whose ``launch_kernel`` starts a kernel of ``language`` (one of :attr:`languages`)
        named ``name`` in the same container and workspace, under the same limits, with
        ``env`` added; its ``poll``, ``wait``, ``send_signal`` (to the kernel's process group),
        ``kill`` and ``kill_strays`` reach that kernel and its descendants alone, and its
        ``cleanup`` never removes the container. This sandbox's own clean-up after an
        execution spares those kernels; its hard stop (``kill``) ends them too.

        ``restored``: the kernel named ``name`` that :meth:`restore` brought back, running,
        which the face's first launch connects to (:class:`BackendError` if the image held
        none of that name, or it did not come back)."""
        raise BackendError(f"the {self.info.backend} backend runs one kernel per sandbox")

    async def connection_info(self) -> dict[str, Any] | None:
        """The host-side connection info of the kernel running now (after ``load``), if any."""
        return None

    async def started(self) -> None:
        """The kernel last launched (or restored) answered its first request, and nothing
        else has reached it yet: what its profile's ``start_cmd`` runs beside it runs now,
        and :meth:`kill_strays` spares it from here on (a backend that cannot tell: nothing)."""
        return None

    async def start_errors(self) -> str | None:
        """The last lines the kernel last launched wrote to its standard error while it
        started (bounded), for the error of a start that failed; None when there are none."""
        return None

    @abstractmethod
    async def poll(self) -> int | None:
        """The kernel process's exit code, or None while it runs."""

    @abstractmethod
    async def wait(self) -> int:
        """Wait until the kernel process exits; its exit code."""

    @abstractmethod
    async def send_signal(self, signum: int) -> None:
        """Signal the kernel process."""

    @abstractmethod
    async def kill(self, restart: bool = False) -> None:
        """Kill every process in the sandbox. ``restart=True`` keeps container and workspace."""

    async def terminate(self, restart: bool = False) -> None:
        """Ask nicely; sandboxed code is untrusted, so by default this is :meth:`kill`."""
        await self.kill(restart=restart)

    @abstractmethod
    async def cleanup(self, restart: bool = False) -> None:
        """Release resources. ``restart=False`` removes the container and the workspace."""

    @abstractmethod
    async def usage(self) -> CgroupUsage:
        """CPU time, memory and OOM kills so far; fields the backend cannot read are None."""

    async def reset_peak_memory(self) -> bool:
        """Restart the peak-memory reading, where the backend can; True if it did."""
        return False

    async def kill_strays(self, keep_kernel_children: bool = True) -> int:
        """Kill the processes an execution left behind: every one but the kernel and, with
        ``keep_kernel_children``, its descendants (daemons re-parented away are not). All are
        stopped before any is killed, so that none forks meanwhile (a fork bomb), and the call
        returns once they are gone. Returns how many; backends that cannot see the processes
        return 0."""
        return 0

    async def start_file_op(self, args: list[str], *, stdin: bool = False) -> CommandProcess:
        """Start the sandbox's file program (``replgate_kernel/fsop.py``) with ``args`` (an
        operation and its absolute paths), as the sandbox's user, beside the kernel: what it
        does to the sandbox's own files, code in the sandbox could do too. Its stdout is its
        answer (and a read's bytes); ``stdin`` stays open for a write's content."""
        raise BackendError(f"the {self.info.backend} backend cannot reach the sandbox's files "
                           "outside its workspace")

    async def start_command(self, command: str, *, env: dict[str, str], cwd: str,
                            stdin: bool = False,
                            pty: tuple[int, int] | None = None) -> CommandProcess:
        """Start ``sh -c command`` beside the kernel, as the sandbox's user, in ``cwd`` (a
        workspace-relative folder, or an absolute path in the sandbox) with ``env`` added to
        the sandbox's environment. ``stdin`` keeps its input open (:meth:`CommandProcess.write`);
        ``pty`` (columns, rows) runs it on a terminal: its output is one ``stdout`` stream and
        the shell has the terminal as its controlling one (job control, ``tput``)."""
        raise BackendError(f"the {self.info.backend} backend cannot run shell commands")

    async def start_watch(self, folder: str, recursive: bool) -> CommandProcess:
        """Start the sandbox's folder watcher (``replgate_kernel/watch.py``) on ``folder``
        (workspace-relative) beside the kernel, as the sandbox's user; its output is the
        watcher's JSON lines."""
        raise BackendError(f"the {self.info.backend} backend cannot watch folders")

    async def checkpoint(self) -> Path:
        """Dump the whole sandbox (every process's memory, threads, open files, ``/tmp``) and
        stop it; the dump, unpacked, where the backend restores from (:meth:`pack_checkpoint`
        keeps it). The caller has dropped its own connections to the kernel, and to the
        code contexts' kernels (:meth:`add_kernel`), first: those that run are dumped with
        it, for :meth:`restore`. On failure (:class:`BackendError`) the sandbox runs on as
        before. See :attr:`SandboxBackend.checkpoints`."""
        raise BackendError(f"the {self.info.backend} backend cannot checkpoint a sandbox")

    async def checkpoint_bytes(self, dump: Path) -> int:
        """What :meth:`checkpoint`'s dump takes on disk."""
        raise BackendError(f"the {self.info.backend} backend cannot checkpoint a sandbox")

    async def pack_checkpoint(self, dump: Path, stem: Path) -> Path:
        """Pack the dump into one private file named ``stem`` plus a suffix of the backend's,
        then remove the dump; that file. On failure (:class:`BackendError`) or cancellation
        no file is left and the dump stays (restorable, or for :meth:`discard_checkpoint`); a
        cancellation that comes once the file is whole is too late, and the file is returned."""
        raise BackendError(f"the {self.info.backend} backend cannot checkpoint a sandbox")

    async def discard_checkpoint(self, dump: Path) -> None:
        """Remove :meth:`checkpoint`'s dump (not packed, no longer wanted)."""
        raise BackendError(f"the {self.info.backend} backend cannot checkpoint a sandbox")

    async def left_checkpoint(self) -> Path | None:
        """The dump a :meth:`checkpoint` of this (stopped) sandbox left, neither packed nor
        removed (its gateway stopped meanwhile), if it is whole; a partial one is removed.
        None where the backend cannot checkpoint."""
        return None

    async def restore(self, image: Path) -> dict[str, Any]:
        """Start the sandbox again from :meth:`pack_checkpoint`'s file (left in place) or from
        :meth:`checkpoint`'s dump not packed yet (removed), its kernel as it was (and the
        code contexts' kernels, for :meth:`add_kernel` with ``restored``); the kernel's
        host-side connection info, as :meth:`launch_kernel` gives. On failure
        (:class:`BackendError`) nothing runs and the file is untouched."""
        raise BackendError(f"the {self.info.backend} backend cannot restore a sandbox")

    async def resume_boot(self, boot_id: str) -> None:
        """This sandbox goes on as the machine whose :attr:`boot_id` was ``boot_id`` (a
        paused session resuming in it): it shows that id from now on, and after its next
        start (a resume's ``launch_kernel`` or :meth:`restore`) rather than a new one.
        Nothing where the backend gives no boot id of its own."""
        return None

    def get_info(self) -> SandboxInfo:
        return self.info.model_copy()

    def freeze_warm(self) -> bool:
        """Stop every process of the sandbox where it stands, a warm kernel's waiting to be
        claimed (no CPU while it waits): at once, with no engine call, so the pool decides
        it in its I/O-free step. Whether it froze (False: this sandbox cannot, and runs on);
        :meth:`thaw_warm` ends it."""
        return False

    def thaw_warm(self) -> None:
        """End :meth:`freeze_warm`'s freeze, at once (nothing if it did not freeze)."""
        return None

    async def release(self) -> None:
        """Nothing runs in the sandbox any more (a paused session's, its container gone):
        give back what it holds on the host, its workspace's unused blocks and its mounts.
        Its files stay reachable through :attr:`workspace`."""
        await anyio.to_thread.run_sync(self.workspace.park)

    async def reserve(self) -> None:
        """Take back what :meth:`release` gave, before a kernel runs here again;
        :class:`~kernel_pool.exceptions.StateDirFull` when the host's disk cannot give it
        (the sandbox stays released, its files intact)."""
        await anyio.to_thread.run_sync(self.workspace.unpark)


class SandboxBackend(ABC):
    """Makes and finds sandboxes. One instance per pool."""

    name: str
    stopped_sandboxes: bool = False
    """Whether :meth:`create_stopped` can make a sandbox without starting it (a fork's
    paused copies need it; without it every copy gets a running kernel)."""

    checkpoints: bool = False
    """Whether sandboxes of this backend can :meth:`Sandbox.checkpoint` (a memory pause) on
    this host, as far as :meth:`check` could tell; a profile or a process may still refuse
    one, which the call then says."""
    checkpoint_refusal: str | None = "this backend cannot checkpoint a sandbox"
    """Why :attr:`checkpoints` is False, as a sentence (None when it is True)."""

    def __init__(self, settings: PoolSettings) -> None:
        self.settings = settings

    def memory_available(self) -> int | None:
        """Bytes of memory the machine running the sandboxes has available now (Linux's
        MemAvailable), None where this backend cannot tell: the pool then counts kernels
        alone. Called on the event loop, so cheap and non-blocking."""
        return None

    @abstractmethod
    async def create(self, spec: SandboxSpec) -> Sandbox:
        """A running container with its workspace; no kernel yet."""

    @abstractmethod
    async def load(self, info: SandboxInfo, profile: Profile) -> Sandbox:
        """Take back a sandbox a previous gateway left running."""

    async def create_stopped(self, spec: SandboxSpec) -> Sandbox:
        """A new sandbox with its workspace but nothing running (a paused session's, say a
        fork's copy): its first ``launch_kernel`` starts it. See :attr:`stopped_sandboxes`."""
        raise BackendError(f"the {self.name} backend cannot make a sandbox without starting it")

    async def load_stopped(self, info: SandboxInfo, profile: Profile,
                           env: dict[str, str]) -> Sandbox:
        """A sandbox whose container is gone but whose workspace is kept (a paused session):
        its next ``launch_kernel`` makes the container again. Backends that cannot keep a
        workspace without its container say so."""
        raise BackendError(f"the {self.name} backend cannot take back a paused session")

    async def image_languages(self, image: str) -> tuple[str, ...]:
        """The languages sandboxes of ``image`` offer (a backend that runs no other kernel:
        python alone)."""
        return ("python",)

    @abstractmethod
    async def list_sandboxes(self) -> list[SandboxInfo]:
        """Sandboxes of this gateway (its owner label, in its state directory), running or not."""

    @abstractmethod
    async def remove(self, info: SandboxInfo) -> None:
        """Remove a sandbox that is not loaded (an orphan): container and workspace."""

    async def list_on_host(self) -> list[SandboxInfo]:
        """Every sandbox with something of its own on the host (a workspace, a socket folder),
        with or without a container: a gateway killed while making one leaves its folders, and
        their mounts, with no container to find them by. None by default."""
        return []

    async def check(self, profiles: list[Profile]) -> None:
        """Raise :class:`BackendError` with one sentence saying what to change when the
        backend cannot run a profile as configured (e.g. its runtime is missing)."""
        return None

    async def image_digest(self, image: str) -> str | None:
        """The content id of ``image`` as the engine has it (for the audit log), if known."""
        return None

    async def close(self) -> None:
        """Release the backend's own resources."""
        return None


def load_backend(name: str, settings: PoolSettings) -> SandboxBackend:
    """The backend registered under ``name`` in the ``replgate.backends`` entry points."""
    found = {ep.name: ep for ep in entry_points(group="replgate.backends")}
    if name not in found:
        raise BackendError(
            f"no sandbox backend {name!r}; installed: {', '.join(sorted(found)) or 'none'}")
    backend_class = found[name].load()
    backend: SandboxBackend = backend_class(settings)
    return backend
