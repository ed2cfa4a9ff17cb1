"""The wire: request and response bodies of the HTTP and WebSocket API (CONTRACT.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kernel_pool.events import Execution

EnvName = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
Timeout = Annotated[float, Field(gt=0, description="seconds; at most the profile's maximum")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SessionCreate(Strict):
    profile: str = Field("default", max_length=128)
    timeout_s: Timeout | None = Field(None, description="default timeout of this session's runs")
    env: dict[EnvName, Annotated[str, Field(max_length=32_768)]] = Field(
        default_factory=dict, max_length=256)
    metadata: dict[str, Any] = Field(default_factory=dict)


class BudgetOut(BaseModel):
    """What is left of the session's budgets (policy file); null where unlimited."""

    executions_left: int | None = None
    wall_time_left_s: float | None = None
    cpu_time_left_s: float | None = None
    lifetime_left_s: float | None = None


class SessionOut(BaseModel):
    id: str
    tenant: str
    profile: str
    status: Literal["idle", "busy", "starting", "dead", "paused"]
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
    reason: str | None = Field(None, description="why the last pause, resume or fork failed; "
                               "the session runs on or stays paused, restorable")


class ForkRequest(Strict):
    count: int = Field(1, ge=1, le=16, description="how many copies")
    metadata: dict[str, Any] = Field(default_factory=dict)


class ExecuteRequest(Strict):
    code: str
    timeout_s: Timeout | None = None


class ExecutionOut(Execution):
    """The contract's Execution, plus the execution's id (to find it again in the history)."""

    id: str


class ExecutionSummary(BaseModel):
    id: str
    seq: int
    code: str
    status: str
    execution_count: int | None
    started_at: str
    finished_at: str | None
    result: Execution | None = None


class InterruptOut(BaseModel):
    interrupted: bool


class FileWritten(BaseModel):
    path: str
    size: int


class Health(BaseModel):
    status: Literal["ok"]
    version: str
    pool: dict[str, int]


# -- WebSocket client messages -----------------------------------------------------------------


class WsExecute(Strict):
    type: Literal["execute"]
    code: str
    timeout_s: Timeout | None = None
    id: str | None = Field(None, min_length=1, max_length=128)


class WsInterrupt(Strict):
    type: Literal["interrupt"]


WsClientMessage = Annotated[WsExecute | WsInterrupt, Field(discriminator="type")]
