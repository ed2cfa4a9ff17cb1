"""Approvals: an execution the policy holds for a person's decision, and that decision."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from ._base import Strict

ApprovalStatus = Literal["pending", "approved", "rejected", "expired", "withdrawn"]


class DecisionIn(Strict):
    """``POST /v1/approvals/{id}/approve`` or ``/reject``: an optional comment."""

    comment: str | None = Field(None, max_length=2000)


class Approval(BaseModel):
    """One held execution and what became of it (the wire shape of ``/v1/approvals``)."""

    approval_id: str
    tenant: str
    session_id: str
    execution_id: str
    code: str
    rules: list[dict[str, Any]] = Field(default_factory=list)
    """The policy matches that asked for approval: rule, action, message, line, matched."""
    status: ApprovalStatus = "pending"
    created_at: str
    expires_at: str
    decided_by: str | None = None
    decided_at: str | None = None
    comment: str | None = None
