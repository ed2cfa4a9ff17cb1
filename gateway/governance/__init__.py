"""Governance: pre-execution policy, human approvals, session budgets (egress is in kernel_pool).

Static checks here are a speed bump, not the boundary: the container is the boundary.
"""

from gateway.governance.analysis import Finding, Match, decide, inspect_code
from gateway.governance.approvals import (
    Approval,
    ApprovalBook,
    ApprovalDecided,
    ApprovalNotFound,
    ApproverKeys,
    Forbidden,
)
from gateway.governance.budgets import BudgetTracker
from gateway.governance.gate import Governance

__all__ = [
    "Approval",
    "ApprovalBook",
    "ApprovalDecided",
    "ApprovalNotFound",
    "ApproverKeys",
    "BudgetTracker",
    "Finding",
    "Forbidden",
    "Governance",
    "Match",
    "decide",
    "inspect_code",
]
