"""The port between the gateway and where sessions run: what it may ask of one session.

Two implementations serve it. :class:`~kernel_pool.Session` is the one in the same process
(one machine, no hop). ``node.remote.RemoteSession`` is the one over the network: every call
is a request to the ``replgate node`` that runs the session, carrying only the serializable
models of this package (events, :class:`PauseInfo`, :class:`Transfer`, :class:`Profile`), and
its executions' events stream back into a handle on the gateway's side.

The gateway types its sessions as :class:`SessionPort` and never reaches below it, so it cannot
tell which one it holds, except in speed. Where they come from is a :class:`SessionHost`: the
gateway's own :class:`~kernel_pool.KernelPool`, or ``node.placement.RemoteNodes``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from kernel_pool._commands import CommandEmit
    from kernel_pool._contexts import ContextInfo
    from kernel_pool._egress import EgressAttempt
    from kernel_pool._handle import ExecutionHandle, Gate
    from kernel_pool._usage import SandboxUsage
    from kernel_pool._workspace import Entry, FileInfo
    from kernel_pool.backends.base import SandboxInfo
    from kernel_pool.config import PoolSettings, Profile
    from kernel_pool.events import CommandResult, Event
    from kernel_pool.state import PauseInfo, SessionStatus, Transfer

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
    env: dict[str, str]
    metadata: dict[str, Any]
    created_at: str
    last_active_at: str
    execution_count: int
    pause_info: PauseInfo | None
    reason: str | None
    transfer: Transfer | None
    listeners: list[Listener]
    transfer_listeners: list[TransferListener]

    @property
    def status(self) -> SessionStatus: ...

    @property
    def paused(self) -> bool: ...

    @property
    def pending(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    @property
    def current(self) -> ExecutionHandle | None: ...

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

    async def write_file(self, path: str, data: bytes) -> int: ...

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
                          on_start: Callable[[], None] | None = None) -> CommandResult:
        """A shell command beside the kernel, to its end; ``emit`` hears its output and
        ``on_start`` is called once the command is running (a kill by its id reaches it)."""

    async def kill_command(self, command_id: str) -> bool:
        """Stop the command running under that id; False when none does."""

    # -- the sandbox --------------------------------------------------------------------------

    def sandbox_info(self) -> SandboxInfo: ...

    async def usage(self) -> SandboxUsage: ...

    async def egress_attempts(self) -> list[EgressAttempt]: ...


class SessionHost(Protocol):
    """Where a gateway's sessions are made and found: its own pool, or the nodes."""

    settings: PoolSettings
    """The profiles sessions may be created with, and the limits they run under."""
    on_session_closed: list[ClosedListener]
    on_session_paused: list[Callable[[SessionPort], None]]
    """Told of a pause the host made by itself (idle, or to make room)."""
    on_session_resumed: list[Callable[[SessionPort], None]]

    def stats(self) -> dict[str, int]:
        """Kernels (``idle``, ``starting``, ``in_use``, ``max``) and sessions (``sessions``,
        ``paused``), as ``/healthz`` and ``/metrics`` show them."""

    def profile(self, name: str) -> Profile: ...

    async def create_session(self, profile: str = "default", *,
                             env: dict[str, str] | None = None,
                             metadata: dict[str, Any] | None = None,
                             session_id: str | None = None) -> SessionPort: ...

    async def fork_session(self, parent_id: str, count: int = 1,
                           metadata: dict[str, Any] | None = None) -> Sequence[SessionPort]: ...

    async def delete_session(self, session_id: str) -> None: ...

    def get_session(self, session_id: str) -> SessionPort:
        """A session this host holds now; SessionNotFound otherwise."""

    @property
    def sessions(self) -> Mapping[str, SessionPort]: ...
