"""A session's network policy: ``GET`` and ``PATCH /v1/sessions/{session_id}/network``."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.deps import GatewayDep, TenantDep
from gateway.network import change_network, network_of
from kernel_pool import NetworkPolicy

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])


@router.get("/{session_id}/network")
async def get_network(session_id: str, tenant: TenantDep, gateway: GatewayDep) -> NetworkPolicy:
    """The policy the session's sandbox runs under (its own, else its profile's)."""
    return network_of(await gateway.session(tenant, session_id))


@router.patch("/{session_id}/network")
async def patch_network(session_id: str, body: NetworkPolicy, tenant: TenantDep,
                        gateway: GatewayDep) -> NetworkPolicy:
    """Replace the session's policy: its next connections are decided by it (403 when it is
    wider than the profile allows, naming the entry). Kept across pause, resume, fork,
    node moves and gateway restarts."""
    session = await gateway.session(tenant, session_id)
    await change_network(gateway.store, session, body)
    return network_of(session)
