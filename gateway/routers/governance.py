"""Approvals (``/v1/approvals``) and a session's egress log (``/v1/sessions/{id}/egress``).

Agent keys may list their tenant's approvals; only approver keys (``REPLGATE_APPROVER_KEYS``)
may decide, and only on their own tenant's executions. Another tenant's approval is a 404.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Query, Request
from pydantic import BaseModel

from common.keys import Approver
from gateway.auth import extract_token
from gateway.deps import GatewayDep, TenantDep
from gateway.errors import Forbidden
from gateway.governance import Approval
from gateway.wire import DecisionIn, EgressAttempt

router = APIRouter(tags=["governance"])


class Caller(BaseModel):
    tenant: str
    approver: Approver | None = None


async def get_caller(request: Request, gateway: GatewayDep,
                     token: Annotated[str | None, Query(include_in_schema=False)] = None
                     ) -> Caller:
    """An approver key's approver, or an agent key's tenant; 401 for neither."""
    key = extract_token(request.headers.get("authorization"), token)
    approver = gateway.governance.approvers.find(key)
    if approver is not None:
        return Caller(tenant=approver.tenant, approver=approver)
    return Caller(tenant=await gateway.authenticate(key))


CallerDep = Annotated[Caller, Depends(get_caller)]


@router.get("/v1/approvals")
async def list_approvals(caller: CallerDep, gateway: GatewayDep) -> list[Approval]:
    """The tenant's executions waiting for a person's approval, oldest first."""
    return await gateway.governance.approvals.pending(caller.tenant)


@router.get("/v1/approvals/{approval_id}")
async def get_approval(approval_id: str, caller: CallerDep, gateway: GatewayDep) -> Approval:
    """One approval, pending or decided (recent ones)."""
    return await gateway.governance.approvals.get(approval_id, caller.tenant)


async def _decide(gateway: GatewayDep, caller: Caller, approval_id: str, approve: bool,
                  body: DecisionIn | None) -> Approval:
    book = gateway.governance.approvals
    if caller.approver is None:
        await book.get(approval_id, caller.tenant)  # another tenant's: 404 before 403
        raise Forbidden("deciding an approval needs an approver key (REPLGATE_APPROVER_KEYS); "
                        "an agent's API key may only list approvals")
    return await book.decide(approval_id, caller.approver, approve,
                             body.comment if body else None)


@router.post("/v1/approvals/{approval_id}/approve")
async def approve(approval_id: str, caller: CallerDep, gateway: GatewayDep,
                  body: Annotated[DecisionIn | None, Body()] = None) -> Approval:
    """Let the held execution run."""
    return await _decide(gateway, caller, approval_id, True, body)


@router.post("/v1/approvals/{approval_id}/reject")
async def reject(approval_id: str, caller: CallerDep, gateway: GatewayDep,
                 body: Annotated[DecisionIn | None, Body()] = None) -> Approval:
    """Refuse the held execution: it ends ``denied`` without running."""
    return await _decide(gateway, caller, approval_id, False, body)


@router.get("/v1/sessions/{session_id}/egress")
async def egress_log(session_id: str, tenant: TenantDep,
                     gateway: GatewayDep) -> list[EgressAttempt]:
    """The session's latest connection attempts through its egress proxy (empty without one)."""
    return await gateway.egress_attempts(tenant, session_id)
