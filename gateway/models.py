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
    status: Literal["idle", "busy", "starting", "dead"]
    execution_count: int
    created_at: str
    last_active_at: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    budget: BudgetOut = Field(default_factory=BudgetOut)


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


CommandEnv = dict[EnvName, Annotated[str, Field(max_length=32_768)]]


class CommandRequest(Strict):
    """``POST /v1/sessions/{id}/commands``: a shell command to run beside the kernel."""

    cmd: str = Field(max_length=100_000, description="run as `sh -c CMD`")
    timeout_s: Timeout | None = None
    env: CommandEnv = Field(default_factory=dict, max_length=256,
                            description="added to the session's environment")
    cwd: str | None = Field(None, max_length=4096,
                            description="folder relative to the workspace, or under /workspace "
                            "(default: its root)")
    id: str | None = Field(None, min_length=1, max_length=128,
                           pattern=r"^[A-Za-z0-9_.-]+$",
                           description="a name for the command, to kill it while it runs")


class KillOut(BaseModel):
    killed: bool


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


class WsCommand(CommandRequest):
    """Run a shell command; its output streams as ``stdout``/``stderr`` events, then ``done``
    with ``exit_code``, each with the command's id as ``execution_id`` and ``command_id``."""

    type: Literal["command"]


class WsKillCommand(Strict):
    type: Literal["kill_command"]
    id: str


WsClientMessage = Annotated[WsExecute | WsInterrupt | WsCommand | WsKillCommand,
                            Field(discriminator="type")]
