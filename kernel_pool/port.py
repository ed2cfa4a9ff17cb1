"""The port between the gateway and where sessions run: what it may ask of one session.

Two implementations serve it. :class:`~kernel_pool.Session` is the one in the same process
(one machine, no hop). ``node.remote.RemoteSession`` is the one over the network: every call
is a request to the ``replgate node`` that runs the session, carrying only the serializable
models of this package (events, :class:`PauseInfo`, :class:`Transfer`, :class:`Profile`), and
its executions' events stream back into a handle on the gateway's side.

The gateway types its sessions as :class:`SessionPort` and never reaches below it, so it cannot
tell which one it holds, except in speed. Where they come from is a :class:`SessionHost`: the
gateway's own :class:`~kernel_pool.KernelPool`, or ``node.placement.RemoteNodes``. Both hosts
answer every call, each as its kind can (a pool of one machine has one node and cannot drain
it: :class:`~kernel_pool.NotDrainable`), so the gateway never asks which one it has.

A session's facts (status, counts, what its pause kept) are one :class:`SessionState`,
declared once in :mod:`kernel_pool.state`: :meth:`SessionPort.state` is how they are read.
Three stay properties because they are read where building a state would cost:
:attr:`SessionPort.current` (a stream asks it of each event), :attr:`SessionPort.closed`,
and :attr:`SessionPort.pending` (every submission counts its tenant's running executions).
"""

from __future__ import annotations

from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Mapping,
    Sequence,
)
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from kernel_pool._commands import CommandEmit
    from kernel_pool._contexts import ContextInfo
    from kernel_pool._egress import EgressAttempt
    from kernel_pool._entries import Entry, FileInfo
    from kernel_pool._handle import ExecutionHandle, Gate
    from kernel_pool._network import NetworkPolicy
    from kernel_pool._sandbox_files import SandboxEntry, SandboxFsAnswer, SandboxFsRequest
    from kernel_pool._usage import SandboxUsage
    from kernel_pool._watch import DirWatch
    from kernel_pool.backends.base import SandboxInfo
    from kernel_pool.config import PoolSettings, Profile
    from kernel_pool.events import CommandResult, Event, PtySize
    from kernel_pool.state import NodeRecord, PauseInfo, SessionState, SnapshotSaved, Transfer

Listener = Callable[["SessionPort", "ExecutionHandle", "Event | None"], None]
"""Told of each event of every execution of a session (``None``: the execution started)."""
TransferListener = Callable[["SessionPort", "Transfer"], None]
"""Told of a pause's or resume's progress."""
ClosedListener = Callable[["SessionPort", str], None]
"""Told, with the reason, that a session was closed (deleted, culled, over its lifetime)."""


class SessionPort(Protocol):
    """One session, wherever it runs: its state, its executions, its files and commands."""

    id: str
    profile: Profile
    listeners: list[Listener]
    transfer_listeners: list[TransferListener]

    def state(self) -> SessionState:
        """Its facts as of now (a remote session: as of its node's last answer, which
        :meth:`refresh` asks again)."""

    async def refresh(self) -> None:
        """Ask where it runs for its state now (another gateway may have run code in it
        since); nothing to ask for one in this process."""

    @property
    def closed(self) -> bool:
        """Deleted, culled or moved away: it takes no more calls."""

    @property
    def current(self) -> ExecutionHandle | None:
        """The execution running now, if any."""

    @property
    def pending(self) -> int:
        """Executions queued or running (the gateway counts a tenant's with every submit)."""

    # -- executions ---------------------------------------------------------------------------

    def submit(self, code: str, timeout_s: float | None = None,
               execution_id: str | None = None, gate: Gate | None = None, *,
               language: str | None = None, context_id: str | None = None) -> ExecutionHandle:
        """Queue code; the handle streams its events and ends with its result. ``gate`` (the
        gateway's approvals and policy) decides, in queue order, whether it runs.
        ``language`` or ``context_id`` picks the code context it runs in (Python's own by
        default)."""

    async def interrupt(self, context_id: str | None = None) -> bool: ...

    async def restart(self) -> None: ...

    def relay(self, msg_type: str, content: dict[str, Any], *,
              channel: str = "shell") -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """One raw Jupyter request beside the queue, and the messages it caused."""

    # -- code contexts ------------------------------------------------------------------------

    @property
    def languages(self) -> tuple[str, ...]:
        """The languages the session's image offers."""

    async def list_contexts(self) -> list[ContextInfo]: ...

    async def create_context(self, language: str | None = None,
                             cwd: str | None = None) -> ContextInfo: ...

    async def restart_context(self, context_id: str) -> None: ...

    async def remove_context(self, context_id: str) -> None: ...

    # -- lifecycle ----------------------------------------------------------------------------

    def pause(self) -> Awaitable[PauseInfo]: ...

    async def resume(self) -> None: ...

    async def close(self) -> None: ...

    # -- files and commands -------------------------------------------------------------------

    async def read_file(self, path: str, limit: int) -> bytes: ...

    async def write_file(self, path: str, data: bytes,
                         metadata: dict[str, str] | None = None) -> int: ...

    async def list_files(self) -> list[FileInfo]: ...

    async def stat_path(self, path: str) -> Entry: ...

    async def list_dir(self, path: str, depth: int = 1) -> list[Entry]: ...

    async def make_dir(self, path: str) -> bool: ...

    async def remove_path(self, path: str) -> None: ...

    async def move_path(self, source: str, destination: str) -> Entry: ...

    async def run_command(self, command: str, *, timeout_s: float | None = None,
                          env: dict[str, str] | None = None, cwd: str | None = None,
                          command_id: str | None = None,
                          emit: CommandEmit | None = None,
                          on_start: Callable[[], None] | None = None,
                          stdin: bool = False, pty: PtySize | None = None) -> CommandResult:
        """A shell command beside the kernel, to its end; ``emit`` hears its output and
        ``on_start`` is called once the command is running (a kill by its id reaches it).
        ``stdin`` keeps its standard input open for :meth:`send_command_input`; ``pty`` runs
        it on a terminal of that size (stdin open, its output one ``stdout`` stream)."""

    async def kill_command(self, command_id: str) -> bool:
        """Stop the command running under that id; False when none does."""

    async def send_command_input(self, command_id: str, data: bytes) -> None:
        """Write ``data`` to a running command's stdin (or terminal); :class:`CommandNotFound`
        when none runs under that id, :class:`CommandInputClosed` when its stdin is not open."""

    async def close_command_input(self, command_id: str) -> None:
        """Close a running command's stdin (it reads its end); as :meth:`send_command_input`
        refuses. Closing it twice is no error."""

    async def resize_command(self, command_id: str, size: PtySize) -> None:
        """Resize a running command's terminal; :class:`CommandInputClosed` for a command
        without one."""

    async def watch_dir(self, path: str, recursive: bool = False, *,
                        watch_id: str | None = None) -> DirWatch:
        """Watch a workspace folder (``""``: all of it); the watch once it is in place, its
        events in order, ending with an ``end`` event (a pause, the session's end, a lost
        node, a lagging consumer), never an error. At most ``max_watches`` at once."""

    # -- the sandbox's own files, outside the workspace (kernel_pool._sandbox_fs) ------------

    async def sandbox_fs(self, request: SandboxFsRequest) -> SandboxFsAnswer:
        """Stat, list, make, remove or move an absolute path of the sandbox, done in its
        container as its user (a paused session is resumed first); refusals are
        :class:`~kernel_pool.SandboxFileError` and below."""

    def sandbox_read(self, path: str, limit: int) -> AsyncGenerator[bytes, None]:
        """A file of the sandbox, streamed: its refusal (missing, denied, a folder, over
        ``limit`` bytes: :class:`~kernel_pool.FileTooLarge`) is raised before the first piece,
        which may be empty."""

    async def sandbox_write(self, path: str, chunks: AsyncIterable[bytes]) -> SandboxEntry:
        """Create or replace a file of the sandbox (parents made) from ``chunks``; if they
        raise, the write stops and a file it created is removed."""

    # -- the sandbox --------------------------------------------------------------------------

    def sandbox_info(self) -> SandboxInfo: ...

    async def usage(self) -> SandboxUsage: ...

    async def egress_attempts(self) -> list[EgressAttempt]: ...

    # -- its network policy (kernel_pool.network) ---------------------------------------------

    @property
    def network(self) -> NetworkPolicy | None:
        """Its network policy (None: its profile's ``egress_allow``, if any)."""

    async def set_network(self, policy: NetworkPolicy | None) -> None:
        """Apply a network policy to its next connections (the caller checked it against the
        profile's bound); kept across restarts, pauses, resumes, and inherited by forks."""


class SessionHost(Protocol):
    """Where a gateway's sessions are made and found: its own pool, or the nodes.

    A session carries its tenant as an opaque label (given at its creation, inherited by a
    fork's copies) that the host keeps for the gateway and never reads otherwise: asked for a
    tenant's session, a host answers as if another tenant's did not exist.

    :meth:`find`, :meth:`tenant_of`, :meth:`list_sessions` and :meth:`count_sessions` see a
    session of this process's pool as soon as it is made; on nodes, once it is recorded in the
    shared database, which the gateway does right after a create or a fork.
    """

    first_epoch: ClassVar[int]
    """The epoch a new session's record starts at: 0 in this process (no placement), 1 on
    nodes (its first placement; each later one raises it and fences an older owner off)."""

    settings: PoolSettings
    """The profiles sessions may be created with, and the limits they run under."""
    on_session_closed: list[ClosedListener]
    on_session_paused: list[Callable[[SessionPort], None]]
    """Told of a pause the host made by itself (idle, or to make room)."""
    on_session_resumed: list[Callable[[SessionPort], None]]

    def stats(self) -> dict[str, int]:
        """Kernels (``idle``, ``starting``, ``in_use``, ``max``) and sessions (``sessions``,
        ``paused``), as ``/healthz`` and ``/metrics`` show them; a machine's pool adds
        ``memory_short`` (1 while its memory is under the reserve), a cluster's ``nodes``."""

    def profile(self, name: str) -> Profile: ...

    async def create_session(self, profile: str = "default", *,
                             env: dict[str, str] | None = None,
                             metadata: dict[str, Any] | None = None,
                             session_id: str | None = None, tenant: str = "",
                             admitted: Awaitable[None] | None = None) -> SessionPort:
        """A new session of ``tenant``. ``admitted``, when given, must end without error
        before the session is used (it raises what refuses the tenant one more session): the
        host awaits it at the latest moment it can, beside the work it does anyway."""

    async def fork_session(self, parent_id: str, count: int = 1,
                           metadata: dict[str, Any] | None = None) -> Sequence[SessionPort]: ...

    # -- saved snapshots (E2B's create_snapshot): see kernel_pool._pool_snapshots ------------

    async def snapshot_session(self, session_id: str, snapshot_id: str, *, tenant: str,
                               memory: bool = True) -> SnapshotSaved:
        """Save the session's variables (unless ``memory`` is False) and files as snapshot
        ``snapshot_id`` of ``tenant``, where every node of this host can read it; the session
        goes on unchanged."""

    async def create_from_snapshot(self, snapshot_id: str, *, tenant: str, profile: str,
                                   env: dict[str, str] | None = None,
                                   metadata: dict[str, Any] | None = None,
                                   admitted: Awaitable[None] | None = None) -> SessionPort:
        """A new session of ``tenant``, a copy of that saved snapshot (``profile``: the
        snapshot's); :class:`~kernel_pool.SnapshotNotFound` when the tenant has none of that
        id. ``admitted``: see :meth:`create_session`."""

    async def delete_snapshot(self, tenant: str, snapshot_id: str) -> None:
        """Remove a saved snapshot (none: no error); the sessions made from it go on."""

    async def delete_session(self, session_id: str) -> None: ...

    def get_session(self, session_id: str) -> SessionPort:
        """A session this host holds now; SessionNotFound otherwise."""

    async def find(self, session_id: str, *, tenant: str | None = None) -> SessionPort:
        """The live session wherever it runs (on nodes: reached, or recovered from a node that
        is lost or drained); :class:`~kernel_pool.SessionNotFound` when there is none, or
        when ``tenant`` is given and it is another tenant's."""

    async def tenant_of(self, session_id: str) -> str | None:
        """The tenant of a live session; None when there is none."""

    async def list_sessions(self, tenant: str | None = None) -> Sequence[SessionPort]:
        """The live sessions (of ``tenant``, if given)."""

    async def count_sessions(self, tenant: str | None = None) -> int:
        """How many :meth:`list_sessions` would list, without reaching them."""

    async def nodes(self) -> list[NodeRecord]:
        """The nodes sessions run on (one machine: one, this process)."""

    async def drain(self, node_id: str, draining: bool) -> NodeRecord:
        """Take a node out of service (no new sessions; its sessions paused) or back in;
        :class:`~kernel_pool.UnknownNode`, or :class:`~kernel_pool.NotDrainable` where
        there is nowhere to drain to."""

    async def languages(self, profile: str) -> tuple[str, ...] | None:
        """The languages a session of ``profile`` offers; None when not known before one runs
        (on nodes)."""

    @property
    def sessions(self) -> Mapping[str, SessionPort]: ...

    # -- profiles added while it runs (custom templates) ---------------------------------------

    @property
    def adds_profiles(self) -> bool:
        """Whether :meth:`set_profile` works here (this machine's pool; nodes with a bundle
        store, which carries a template's image to them)."""

    def set_profile(self, profile: Profile) -> None:
        """Add a profile while the host runs, or replace the one of its name (its ``min_idle``
        changed): it fills to its ``min_idle``, its idle kernels of another image are
        removed. :class:`~kernel_pool.InvalidRequest` where :attr:`adds_profiles` is False."""

    def remove_profile(self, name: str) -> None:
        """Forget a profile :meth:`set_profile` added: its idle kernels are removed, its
        sessions run on to their end."""
