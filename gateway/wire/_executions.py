"""Executions: the request that runs code in a session, its answer (the contract's
Execution with its id), the history's summary of one, and an interrupt's answer.
"""

from __future__ import annotations

from pydantic import BaseModel

from kernel_pool import Execution

from ._base import Strict, Timeout
from ._contexts import ContextId, Language


class ExecuteRequest(Strict):
    code: str
    timeout_s: Timeout | None = None
    language: Language | None = None
    context_id: ContextId | None = None


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
