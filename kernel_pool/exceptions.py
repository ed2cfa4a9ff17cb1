"""The errors replgate's kernel pool raises, each with a message a user can act on.

    KernelPoolError
    ├── ImageError             the sandbox image cannot be built or found
    │   └── TemplateBuildFailed     a custom template's build failed: its step (line) and why
    ├── BackendError           the container engine failed or is unreachable
    ├── ProfileNotFound        no profile of that name
    ├── CapacityError          the pool is at max_kernels
    ├── KernelStartError       a kernel did not come up
    ├── KernelUnavailable      the session's kernel is not running (closed, or did not come back)
    │   └── NodeUnreachable    the session's node did not answer
    ├── SessionNotFound        no such session (or not yours)
    ├── SessionClosed          the session was deleted or culled
    ├── QueueFull              too many executions waiting on one session
    ├── TooManyCommands        too many shell commands running in one session
    ├── CommandNotFound        no running shell command of that id in the session
    ├── CommandInputClosed     a command's stdin is not open (not asked for, or closed)
    ├── TooManyWatches         too many folders watched in one session
    ├── ExecutionIdTaken       a caller-chosen execution id is already used
    ├── InvalidRequest         a value out of range (timeout, ...)
    │   └── UnknownLanguage    a language the session's image does not offer
    ├── ContextNotFound        no code context of that id in the session
    ├── ContextStartFailed     a context's kernel started but its set-up (its folder) failed
    ├── PayloadTooLarge        code or an upload over its size limit
    ├── StateDirFull           the state directory (database, workspaces) has no room left
    ├── SnapshotError          a pause, resume or fork could not keep or restore the state
    │   ├── SnapshotBudgetExceeded   no room for another snapshot
    │   └── SnapshotNotFound   no saved snapshot of that id (or not yours)
    ├── NoNodeAvailable        no node can take a new session
    ├── UnknownNode            no node has that id
    ├── NotDrainable           a host with one node (this machine) cannot drain it
    ├── SandboxFileError       a path of the sandbox (outside the workspace) it refused
    │   ├── SandboxFileMissing       no such file or folder there
    │   ├── SandboxFileDenied        its user may not (read-only folder, another's file)
    │   ├── SandboxFileExists        something is in the way
    │   └── SandboxDiskFull          no room left there
    └── WorkspaceError         a file path or size the workspace refuses
        ├── PathOutsideWorkspace
        ├── FileMissing        no such file in the workspace
        ├── FileTooLarge       a file over the download limit
        └── WorkspaceFull      the workspace's size cap is reached

An error in the user's code is not an exception here: it is data (an ``error`` event). Each
error carries the ids and figures it names; the gateway maps the classes to HTTP statuses in
one table (``gateway/errors.py``), never by their message.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol


class KernelPoolError(Exception):
    """Base of every replgate pool error."""


class ImageError(KernelPoolError):
    """The sandbox image could not be built or is missing."""


class TemplateBuildFailed(ImageError):
    """A custom template's image could not be built: which step failed (the 1-based line of
    the user's Dockerfile where it starts; None for replgate's own steps) and why."""

    def __init__(self, reason: str, *, step: int | None = None, line: int | None = None) -> None:
        self.reason = reason
        self.step = step
        self.line = line
        super().__init__(reason)


class BackendError(KernelPoolError):
    """The container engine failed, or could not be reached."""


class ProfileNotFound(KernelPoolError):
    def __init__(self, profile: str, known: list[str]) -> None:
        self.profile = profile
        super().__init__(f"unknown profile {profile!r}; known profiles: {', '.join(known)}")


class CapacityError(KernelPoolError):
    """No room for one more running kernel: ``limit`` kernels run, or (``reserve`` given, in
    bytes) the host's available memory is under that reserve."""

    def __init__(self, profile: str, limit: int, reserve: int | None = None) -> None:
        self.profile = profile
        self.limit = limit
        self.reserve = reserve
        if reserve is None:
            why = (f"the pool is at its limit of {limit} kernels; delete idle sessions or raise "
                   "REPLGATE_MAX_KERNELS")
        else:
            why = (f"the host's available memory is under the {reserve // 2**20} MiB it keeps "
                   "(REPLGATE_MEMORY_RESERVE) and no idle session could be paused; delete idle "
                   "sessions or lower the reserve")
        super().__init__(f"no kernel available for profile {profile!r}: {why}")


class KernelStartError(KernelPoolError):
    def __init__(self, sandbox_id: str, reason: str) -> None:
        self.sandbox_id = sandbox_id
        self.reason = reason
        super().__init__(f"kernel in sandbox {sandbox_id} did not start: {reason}")


class KernelUnavailable(KernelPoolError):
    def __init__(self, session_id: str, reason: str) -> None:
        self.session_id = session_id
        super().__init__(f"the kernel of session {session_id} is not running: {reason}")


class NodeUnreachable(KernelUnavailable):
    """The session's node did not answer (down, restarting, or the network between)."""


class SessionNotFound(KernelPoolError):
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(f"session {session_id} not found")


class SessionClosed(KernelPoolError):
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(f"session {session_id} is closed; create a new session")


class QueueFull(KernelPoolError):
    def __init__(self, session_id: str, limit: int) -> None:
        self.session_id = session_id
        super().__init__(
            f"session {session_id} already has {limit} executions waiting; wait for them to "
            "finish or raise REPLGATE_MAX_QUEUED_EXECUTIONS"
        )


class TooManyCommands(KernelPoolError):
    def __init__(self, session_id: str, limit: int) -> None:
        self.session_id = session_id
        super().__init__(
            f"session {session_id} already runs {limit} shell commands; wait for one to end, "
            "kill one, or raise REPLGATE_MAX_COMMANDS")


class CommandNotFound(KernelPoolError):
    def __init__(self, session_id: str, command_id: str) -> None:
        self.session_id = session_id
        self.command_id = command_id
        super().__init__(f"no shell command {command_id!r} is running in session {session_id}; "
                         "it ended, or was never started")


class CommandInputClosed(KernelPoolError):
    def __init__(self, command_id: str, why: str) -> None:
        self.command_id = command_id
        super().__init__(f"command {command_id!r} takes no input: {why}")


class TooManyWatches(KernelPoolError):
    def __init__(self, session_id: str, limit: int) -> None:
        self.session_id = session_id
        super().__init__(
            f"session {session_id} already watches {limit} folders; stop a watch first, or "
            "raise REPLGATE_POOL__MAX_WATCHES")


class ExecutionIdTaken(KernelPoolError):
    def __init__(self, execution_id: str) -> None:
        self.execution_id = execution_id
        super().__init__(f"execution id {execution_id!r} is already used; send a new one")


class InvalidRequest(KernelPoolError):
    """A request value is out of range; the message names the limit."""


class UnknownLanguage(InvalidRequest):
    def __init__(self, language: str, offered: list[str]) -> None:
        self.language = language
        self.offered = offered
        super().__init__(
            f"unknown language {language!r}; this session offers: {', '.join(offered)}"
            + ("" if "r" in offered else
               " (R, JavaScript/TypeScript and Java are in the default image; this session's "
               "profile names the slim one or an image of its own)"))


class ContextNotFound(KernelPoolError):
    def __init__(self, session_id: str, context_id: str) -> None:
        self.session_id = session_id
        self.context_id = context_id
        super().__init__(f"session {session_id} has no code context {context_id!r}; list "
                         "its contexts for their ids")


class ContextStartFailed(KernelPoolError):
    """A context's kernel started but its set-up (its working folder, Java's properties)
    failed: the message says why, in the kernel's own words."""


class PayloadTooLarge(KernelPoolError):
    def __init__(self, what: str, limit: int, hint: str = "") -> None:
        self.what = what
        self.limit = limit
        super().__init__(f"{what} is over the limit of {limit} bytes{hint}")


class StateDirFull(KernelPoolError):
    def __init__(self, free: int, detail: str) -> None:
        self.free = free
        super().__init__(f"the gateway's state directory is full ({free} bytes free, {detail})")


class WorkspaceError(KernelPoolError):
    """The workspace refuses a path or a size."""


class PathOutsideWorkspace(WorkspaceError):
    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"path {path!r} leaves the session's workspace; use a relative path")


class FileMissing(WorkspaceError):
    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"{path!r} does not exist in the workspace")


class FileTooLarge(WorkspaceError):
    def __init__(self, path: str, size: int, limit: int) -> None:
        self.path = path
        self.size = size
        self.limit = limit
        super().__init__(f"{path!r} is {size} bytes, over the download limit of {limit}")


class WorkspaceFull(WorkspaceError):
    def __init__(self) -> None:
        super().__init__("the session's workspace is full; delete files or raise the profile's "
                         "workspace_size")


class SnapshotError(KernelPoolError):
    """A snapshot could not be taken or put back; the message says why (the ``reason``).

    The session is left running, or paused with its snapshot, never in between."""


class SnapshotBudgetExceeded(SnapshotError):
    """The state directory has no room for another snapshot (HTTP 507)."""


class SnapshotNotFound(SnapshotError):
    """A saved snapshot (E2B's ``create_snapshot``) that does not exist, or is another
    tenant's: exactly as absent."""

    def __init__(self, snapshot_id: str) -> None:
        self.snapshot_id = snapshot_id
        super().__init__(f"snapshot {snapshot_id!r} not found")


class _Node(Protocol):
    """What :class:`NoNodeAvailable` reads of a node (a :class:`~kernel_pool.NodeRecord`)."""

    @property
    def id(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def sessions(self) -> int: ...

    @property
    def max_kernels(self) -> int: ...


class NoNodeAvailable(KernelPoolError):
    """No node can take a new session: all full, draining, down or silent."""

    full = False
    """Every node that could take it holds its most (a limit, not a failure: 429)."""

    def __init__(self, nodes: Sequence[_Node], exclude: Collection[str] = ()) -> None:
        self.nodes = list(nodes)
        if not nodes:
            why = "no node is registered: start one with 'replgate node' on the same database"
        else:
            counts: dict[str, int] = {}
            for node in nodes:
                if node.id in exclude:
                    reason = "excluded"
                elif node.state != "up":
                    reason = node.state
                elif node.sessions >= node.max_kernels:
                    reason = "full"
                else:
                    reason = "silent (heartbeat late)"
                counts[reason] = counts.get(reason, 0) + 1
            # Every node it could go to is up: each was full at the claim (one may have given
            # a slot back since); one down or draining is a failure or an operator's doing.
            candidates = [node for node in nodes if node.id not in exclude]
            self.full = bool(candidates) and all(node.state == "up" for node in candidates)
            states = ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items()))
            why = (f"all {len(nodes)} nodes are busy or away ({states}); delete idle sessions, "
                   "start another node, raise a node's REPLGATE_MAX_KERNELS or undrain one")
        super().__init__(f"no node can take a new session: {why}")


class UnknownNode(KernelPoolError, LookupError):
    """No node has that id."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        super().__init__(f"no node {node_id!r} is registered")


class NotDrainable(KernelPoolError):
    """A host that is one machine has nowhere to drain its one node to."""

    def __init__(self) -> None:
        super().__init__("one machine has one node, this gateway: there is nowhere to drain "
                         "it to (run `replgate node` processes with a shared database)")


class SandboxFileError(KernelPoolError):
    """A path of the sandbox's own file system (outside its workspace) that the sandbox refused
    to its user, as it would refuse code running there; the message is the sandbox's.

    Subclasses: :class:`SandboxFileMissing`, :class:`SandboxFileDenied`,
    :class:`SandboxFileExists`, :class:`SandboxDiskFull`."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        super().__init__(message)


class SandboxFileMissing(SandboxFileError):
    """No such file or folder in the sandbox."""


class SandboxFileDenied(SandboxFileError):
    """The sandbox's user may not do that there (a read-only system folder, root's file)."""


class SandboxFileExists(SandboxFileError):
    """Something is in the way (a file where a folder was asked for, a folder not empty)."""


class SandboxDiskFull(SandboxFileError):
    """The sandbox's file system (its ``/tmp``, its workspace) has no room left."""
