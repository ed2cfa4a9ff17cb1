"""The gate every execution passes before its code reaches the kernel, and its records.

For each execution, under the session's lock (so order is kept), :meth:`Governance.gate`:

1. inspects the code against the rules for the tenant and profile: a ``deny`` match ends it
   ``denied`` (``PolicyDenied``, naming rule and line);
2. checks the session's budgets: one used up ends it ``budget_exceeded`` (``BudgetExceeded``);
3. on an ``approve`` match, holds it (``pending_approval``) until an approver decides or the
   approval expires; ``rejected`` and ``expired`` end it ``denied``;
4. lowers its ``timeout_s`` to the wall time and lifetime left.

What was decided, by whom and when, goes into the execution's audit record (``extra``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio.to_thread

from common.keys import parse_approver_keys
from common.policy import Policy
from gateway.governance.analysis import Match, decide
from gateway.governance.approvals import ApprovalBook, ApproverKeys
from gateway.governance.budgets import BudgetTracker
from gateway.records.executions import PENDING_APPROVAL, RUNNING
from gateway.store import Store
from gateway.wire import BudgetOut
from kernel_pool import (
    ApprovalEvent,
    Denial,
    Event,
    ExecutionHandle,
    ExecutionStatus,
    Gate,
    PendingApprovalEvent,
    SessionPort,
)

__all__ = ["PENDING_APPROVAL", "Governance"]

logger = logging.getLogger(__name__)

Emit = Callable[[Event], None]
_THREAD_ABOVE = 64 * 1024
"""Code longer than this is inspected in a worker thread, off the event loop."""


class Governance:
    """Policy, approvals and budgets for one gateway; approvals and what sessions used of
    their budgets are in the store's database, which other gateways may share."""

    def __init__(self, store: Store, policy: Policy | None = None, *,
                 approver_keys: str | None = None, approval_timeout_s: float = 600.0) -> None:
        self.store = store
        self.policy = policy or Policy()
        self.approvers = ApproverKeys(parse_approver_keys(approver_keys))
        self.approvals = ApprovalBook(store, approval_timeout_s)
        self._budgets: dict[str, BudgetTracker] = {}
        self._records: dict[str, dict[str, Any]] = {}

    def __repr__(self) -> str:
        return (f"<Governance {self.policy!r}, {len(self.approvers)} approvers, "
                f"{self.approvals!r}>")

    async def close(self) -> None:
        """Stop what runs in the background (the gateway is stopping)."""
        await self.approvals.close()

    # -- budgets -----------------------------------------------------------------------------

    def tracker(self, tenant: str, session: SessionPort) -> BudgetTracker:
        """The session's budget tracker, listening to the session object given (a session on
        a node may be reached through a new one after it moved)."""
        tracker = self._budgets.get(session.id)
        if tracker is None:
            tracker = BudgetTracker(self.policy.budgets_for(tenant, session.profile.name),
                                    session, self.store)
            self._budgets[session.id] = tracker
        tracker.session = session
        if tracker.limited and tracker.listener not in session.listeners:
            session.listeners.append(tracker.listener)
        return tracker

    def budget(self, tenant: str, session: SessionPort) -> BudgetOut:
        """What is left of the session's budgets (all null when unlimited)."""
        if not tenant:  # a session no longer the gateway's
            return BudgetOut()
        return self.tracker(tenant, session).remaining()

    def forget(self, session: SessionPort, reason: str = "") -> None:
        """The session is gone (a ``KernelPool.on_session_closed`` callback)."""
        self._budgets.pop(session.id, None)

    # -- the gate ----------------------------------------------------------------------------

    def gate(self, tenant: str, session: SessionPort) -> Gate:
        """The gate for one execution of the tenant's session (see the module docstring)."""

        async def check(handle: ExecutionHandle, emit: Emit) -> Denial | None:
            return await self._check(tenant, session, handle, emit)

        return check

    async def _check(self, tenant: str, session: SessionPort, handle: ExecutionHandle,
                     emit: Emit) -> Denial | None:
        rules = self.policy.rules_for(tenant, session.profile.name)
        if len(handle.code) > _THREAD_ABOVE and rules:
            decision, matches = await anyio.to_thread.run_sync(decide, rules, handle.code)
        else:
            decision, matches = decide(rules, handle.code)
        record: dict[str, Any] = {}
        if matches:
            record["policy"] = {"decision": decision,
                                "rules": [match.as_dict() for match in matches]}
            self._records[handle.id] = record
        if decision == "deny":
            first = next(m for m in matches if m.action == "deny")
            others = [m.rule for m in matches if m.action == "deny" and m is not first]
            more = f" (also: {', '.join(others)})" if others else ""
            return (ExecutionStatus.DENIED, "PolicyDenied",
                    f"rule {first.rule} matched line {first.line} ({first.matched}): "
                    f"{first.message}{more}; the code did not run")
        tracker = self.tracker(tenant, session)
        if decision == "approve":
            # Not held for a person if it could not run anyway; claimed after the hold.
            denial = await self._over_budget(tracker, handle, record, claim=False)
            if denial is not None:
                return denial
            denial = await self._approval(tenant, session, handle, emit, matches, record)
            if denial is not None:
                return denial
        denial = await self._over_budget(tracker, handle, record, claim=True)
        if denial is not None:
            return denial
        timeout = tracker.clamp(handle.timeout_s)
        if timeout < handle.timeout_s:
            record["timeout_clamped"] = {"asked_s": handle.timeout_s, "to_s": timeout}
            self._records[handle.id] = record
            handle.timeout_s = timeout
        return None

    async def _over_budget(self, tracker: BudgetTracker, handle: ExecutionHandle,
                           record: dict[str, Any], *, claim: bool) -> Denial | None:
        """The denial if a budget is used up; else None, and with ``claim`` the execution
        counted (given back at its end if it does not run)."""
        if not tracker.limited:
            return None
        if claim:
            exceeded = await tracker.claim()
            if exceeded is None:
                tracker.ours.add(handle.id)
        else:
            await tracker.refresh()
            exceeded = tracker.exceeded()
        if exceeded is None:
            return None
        name, message = exceeded
        record["budget"] = {"exceeded": name, "limits": tracker.limits.model_dump(),
                            "used": tracker.used()}
        self._records[handle.id] = record
        return ExecutionStatus.BUDGET_EXCEEDED, "BudgetExceeded", message

    async def _approval(self, tenant: str, session: SessionPort, handle: ExecutionHandle,
                        emit: Emit, matches: list[Match],
                        record: dict[str, Any]) -> Denial | None:
        asking = [m for m in matches if m.action == "approve"]
        approval = await self.approvals.open(
            tenant=tenant, session_id=session.id, execution_id=handle.id, code=handle.code,
            rules=[m.as_dict() for m in asking])
        record["approval"] = {"approval_id": approval.approval_id,
                              "requested_at": approval.created_at,
                              "expires_at": approval.expires_at, "decision": "withdrawn"}
        emit(PendingApprovalEvent(approval_id=approval.approval_id,
                                  rules=[m.rule for m in asking],
                                  expires_at=approval.expires_at))
        logger.info("execution %s of session %s (tenant %s) held for approval %s: %s",
                    handle.id, session.id, tenant, approval.approval_id,
                    ", ".join(m.rule for m in asking))
        await self.approvals.wait(approval)
        assert approval.status in ("approved", "rejected", "expired")
        record["approval"].update(decision=approval.status, by=approval.decided_by,
                                  at=approval.decided_at, comment=approval.comment)
        emit(ApprovalEvent(approval_id=approval.approval_id, decision=approval.status,
                           by=approval.decided_by, at=approval.decided_at or "",
                           comment=approval.comment))
        logger.info("approval %s %s%s", approval.approval_id, approval.status,
                    f" by {approval.decided_by}" if approval.decided_by else "")
        if approval.status == "approved":
            return None
        if approval.status == "rejected":
            why = f"rejected by {approval.decided_by}"
            if approval.comment:
                why += f" ({approval.comment})"
        else:
            why = f"expired after {self.approvals.timeout_s:g}s without a decision"
        rules = ", ".join(m.rule for m in asking)
        return (ExecutionStatus.DENIED, "PolicyDenied",
                f"approval {approval.approval_id} (rule {rules}, line {asking[0].line}) was "
                f"{why}; the code did not run")

    # -- records -----------------------------------------------------------------------------

    def audit_extra(self, execution_id: str) -> dict[str, Any]:
        """What the gate decided for the execution, for its audit record (once)."""
        return self._records.pop(execution_id, {})

    async def follow(self, handle: ExecutionHandle, store: Store) -> None:
        """Keep the history's status in step while the execution is held for approval."""
        async for event in handle.stream():
            if isinstance(event, PendingApprovalEvent):
                await store.set_execution_status(handle.id, PENDING_APPROVAL)
            elif isinstance(event, ApprovalEvent) and event.decision == "approved":
                await store.set_execution_status(handle.id, RUNNING)
