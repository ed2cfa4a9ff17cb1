"""Governance: pre-execution policy, human approvals, session budgets (egress is in kernel_pool).

Static checks here are a speed bump, not the boundary: the container is the boundary.
"""

from gateway.governance.analysis import Finding, Match, decide, inspect_code
from gateway.governance.approvals import (
    Approval,
    ApprovalBook,
    ApprovalDecided,
    ApprovalNotFound,
    Approver,
    ApproverKeys,
    Forbidden,
    parse_approver_keys,
)
from gateway.governance.budgets import BudgetTracker
from gateway.governance.gate import PENDING_APPROVAL, Governance
from gateway.governance.policy import (
    BUILTIN_RULES,
    Budgets,
    Policy,
    PolicyError,
    Rule,
    load_policy,
)

__all__ = [
    "BUILTIN_RULES",
    "PENDING_APPROVAL",
    "Approval",
    "ApprovalBook",
    "ApprovalDecided",
    "ApprovalNotFound",
    "Approver",
    "ApproverKeys",
    "BudgetTracker",
    "Budgets",
    "Finding",
    "Forbidden",
    "Governance",
    "Match",
    "Policy",
    "PolicyError",
    "Rule",
    "decide",
    "inspect_code",
    "load_policy",
    "parse_approver_keys",
]
