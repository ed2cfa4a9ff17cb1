"""Moved to :mod:`common.policy` (the node loads the policy too); re-exported here until the last
importers move."""

from common.policy import BUILTIN_RULES, Budgets, Policy, PolicyError, Rule, load_policy

__all__ = ["BUILTIN_RULES", "Budgets", "Policy", "PolicyError", "Rule", "load_policy"]
