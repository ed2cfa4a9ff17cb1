"""Sessions: the request that makes one or forks it, and how the API describes one (its
budgets, a pause or resume under way, its sandbox's use now).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from kernel_pool import NetworkPolicy

from ._base import EnvName, Strict, Timeout

SESSION_STATES = ("idle", "busy", "starting", "dead", "paused")
"""What ``Session.status`` may be; a client reads it as a plain string, so that a state a
newer gateway adds does not break it."""


class SessionCreate(Strict):
    profile: str = Field("default", max_length=128)
    timeout_s: Timeout | None = Field(None, description="default timeout of this session's runs")
    env: dict[EnvName, Annotated[str, Field(max_length=32_768)]] = Field(
        default_factory=dict, max_length=256)
    metadata: dict[str, Any] = Field(default_factory=dict)
    network: NetworkPolicy | None = Field(
        None, description="what the sandbox may reach (within the profile's bound); "
        "none: the profile's network")


class BudgetOut(BaseModel):
    """What is left of the session's budgets (policy file); null where unlimited."""

    executions_left: int | None = None
    wall_time_left_s: float | None = None
    cpu_time_left_s: float | None = None
    lifetime_left_s: float | None = None


class TransferOut(BaseModel):
    """A pause or resume under way, for a progress bar: the variables' stream so far."""

    operation: Literal["pause", "resume"]
    done_bytes: int
    total_bytes: int = Field(description="a pause: the sandbox's memory in use as it began "
                             "(about the snapshot's size); a resume: the stored snapshot's "
                             "size; 0 when not known")


class SessionMetricsOut(BaseModel):
    """A session's sandbox use now (``GET /v1/sessions/{id}/metrics``, CONTRACT.md)."""

    cpu_used_pct: float = Field(description="CPU used over the last few seconds, as a "
                                "percentage of the sandbox's CPU limit (0 while paused)")
    mem_used_bytes: int = Field(description="memory in use, page cache included as the limit "
                                "counts it (0 while paused)")
    mem_limit_bytes: int
    disk_used_bytes: int = Field(description="what the workspace's files hold")
    disk_limit_bytes: int = Field(description="the workspace's size cap")
    at: str = Field(description="when the figures were read (ISO 8601)")


class SessionOut(BaseModel):
    """A session (CONTRACT.md's Session); the client's ``SessionInfo``."""

    id: str
    tenant: str
    profile: str
    status: Annotated[str, Field(json_schema_extra={"enum": list(SESSION_STATES)})]
    execution_count: int
    created_at: str
    last_active_at: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    budget: BudgetOut = Field(default_factory=BudgetOut)
    paused_with: Literal["memory", "variables"] | None = Field(
        None, description="while paused, what was kept: the whole process (memory) or the "
        "variables only (variables: threads, open files and /tmp are not kept)")
    not_kept: dict[str, str] | None = Field(
        None, description="while paused: variables that could not be kept, with the reason")
    snapshot_bytes: int | None = Field(None, description="while paused: the snapshot's size")
    reason: str | None = Field(None, description="why the last pause, resume or fork failed "
                               "or kept less than asked (a memory pause that kept the variables "
                               "only, a resume from the variables snapshot); the session runs "
                               "on or stays paused, restorable")
    transfer: TransferOut | None = Field(None, description="while a pause or resume moves the "
                                         "session's variables: how far it is")
    node: str | None = Field(None, description="the id of the node running it (one machine: "
                             "the gateway's own, REPLGATE_OWNER); null while paused")


class ForkRequest(Strict):
    count: int = Field(1, ge=1, le=16, description="how many copies")
    metadata: dict[str, Any] = Field(default_factory=dict)
