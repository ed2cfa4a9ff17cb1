"""What a session and a node are, as plain data: the models the port speaks in.

Pydantic only (no Docker, no ZMQ): the gateway, the node and the wire between them build and read
these without loading what runs kernels. A session's fields are declared once, in
:class:`SessionState`; :class:`~kernel_pool.Session` builds one of itself on demand and
``node.remote.RemoteSession`` keeps the last one its node sent.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field

from kernel_pool._network import NetworkPolicy
from kernel_pool.backends.base import SandboxInfo
from kernel_pool.config import Profile


class SessionStatus(StrEnum):
    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    DEAD = "dead"
    PAUSED = "paused"


class KeptContext(BaseModel):
    """A code context whose kernel a memory pause holds, as it was."""

    id: str
    language: str
    name: str | None = None
    """Its kernel's name in the sandbox (the context's, which the memory image records); None
    for a context known only by its id (another node's bundle holds no kernel of it)."""
    cwd: str | None = None
    """The folder it was made with (None: the workspace): a fresh kernel starts there."""


class PauseInfo(BaseModel):
    """What a paused session kept, said honestly."""

    paused_with: Literal["memory", "variables"] = "variables"
    """"variables": the user namespace was kept (dill), not the process (threads, /tmp);
    "memory": the whole sandbox was checkpointed as well (the variables snapshot stays, for
    a restore that fails)."""
    kept: list[str] = Field(default_factory=list)
    not_kept: dict[str, str] = Field(default_factory=dict)
    """What could not be kept, each with the reason: variables by name, ``thread 'name'``,
    ``/tmp/name``; with "memory" only the shell commands the pause stopped (``command '...'``,
    which no pause keeps) and the code contexts it ended (``context 'r'``)."""
    variables_not_kept: dict[str, str] = Field(default_factory=dict)
    """With "memory": the names the variables snapshot could not keep, lost only if the
    memory image cannot be restored (the resume then says so)."""
    image_bytes: int = 0
    """What the session's snapshot takes on disk (variables, and memory image if any)."""
    raw_bytes: int = 0
    """What the kernel wrote of its variables, before compression (0: not known)."""
    contexts: list[KeptContext] = Field(default_factory=list)
    """The code contexts whose kernels a memory image holds (their variables and all): with
    "memory", those it holds; with "variables", those it was to hold, of which ``not_kept``
    says that the variables alone lose them (so does ``variables_not_kept`` with "memory")."""
    paused_at: str = ""
    reseed: bool = False
    """A fork's copy that never ran: its random generators start afresh when it resumes."""
    boot_id: str | None = None
    """The sandbox's boot id as it paused (``Sandbox.boot_id``): its resume keeps it (a fork's
    copy, ``reseed``, boots with its own). None where the sandbox had none of its own."""

    def without_memory(self) -> PauseInfo:
        """What the variables snapshot alone keeps of a memory pause (its image lost, or
        not for a fork's copy); ``image_bytes`` is left to the caller. Its ``contexts`` stay,
        named in ``not_kept``: the variables lose them, the image (packed again) holds them."""
        if self.paused_with != "memory":
            return self
        return self.model_copy(update={
            # (a memory pause's own not_kept: the shell commands it stopped, lost either way)
            "paused_with": "variables", "not_kept": {**self.variables_not_kept, **self.not_kept},
            "kept": [n for n in self.kept if n not in self.variables_not_kept],
            "variables_not_kept": {}})


class Transfer(BaseModel):
    """A pause or resume under way: its variables' stream, so far."""

    operation: Literal["pause", "resume"]
    done_bytes: int = 0
    """A pause: what the kernel wrote so far; a resume: what was read of the stored snapshot."""
    total_bytes: int = 0
    """A pause: the sandbox's memory in use as it began (what the snapshot is about the size
    of); a resume: the stored snapshot's size. 0 when not known."""
    state: Literal["running", "done", "failed"] = "running"
    """Running while it moves. Its last report says how it ended: done (every byte moved,
    ``done_bytes == total_bytes``: a pause's total is then what the kernel wrote) or failed
    (the session runs on, or stays paused, as :attr:`Session.reason` says)."""
    execution_id: str | None = None
    """The execution whose start resumed the paused session (it runs once this is done)."""


class SessionState(BaseModel):
    """Everything a gateway reads of a session without asking again: sent by the node with
    every answer about the session."""

    id: str
    profile: Profile
    env: dict[str, str]
    metadata: dict[str, Any]
    created_at: str
    last_active_at: str
    execution_count: int
    status: SessionStatus
    pending: int
    pause_info: PauseInfo | None = None
    reason: str | None = None
    transfer: Transfer | None = None
    sandbox: SandboxInfo
    languages: tuple[str, ...] = ("python",)
    """The languages its image offers."""
    contexts: dict[str, str] = Field(default_factory=dict)
    """Its code contexts' languages by id, as of this answer."""
    node: str = ""
    """The node running it (on one machine: the pool's owner label). Empty from a node older
    than this field."""
    tenant: str = ""
    """An opaque label its host keeps for the gateway (the API key's tenant that made it; a
    fork's copies inherit it). kernel_pool never reads it."""
    network: NetworkPolicy | None = None
    """Its network policy (None: its profile's ``egress_allow``, if any); a fork's copies
    inherit it."""


class SnapshotSaved(BaseModel):
    """A running or paused session saved under a snapshot id, in the host's bundle store,
    for new sessions to start from (each a copy); the session goes on unchanged."""

    snapshot_id: str
    session_id: str
    """The session it was taken of."""
    profile: str
    """The profile its sessions start on (the image its files and variables belong to)."""
    env: dict[str, str] = Field(default_factory=dict)
    """The session's variables of the environment, which its sessions start with."""
    memory: bool = True
    """Whether it holds the kernel's variables (a paused session's keep): False, its files
    alone, and its sessions start on a fresh kernel."""
    kept: list[str] = Field(default_factory=list)
    not_kept: dict[str, str] = Field(default_factory=dict)
    """What it does not hold, each with the reason (as a paused session's ``not_kept``)."""
    size_bytes: int = 0
    """What it takes in the bundle store (variables and files, before sealing)."""


NodeState = Literal["up", "draining", "down"]


class NodeRecord(BaseModel):
    """A node as ``GET /v1/nodes`` shows it."""

    id: str
    address: str
    """``HOST:PORT``, where gateways reach it."""
    state: NodeState
    kernels: int
    """Kernels it runs (warm or in use), from its last heartbeat."""
    max_kernels: int
    sessions: int
    """Slots taken: its sessions, and those being placed on it."""
    heartbeat_at: str
    """Its last heartbeat, ISO 8601 UTC by the database's clock."""
