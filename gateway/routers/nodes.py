"""The nodes sessions run on (``/v1/nodes``), for operators: admin keys only.

An admin key (``REPLGATE_ADMIN_KEYS``) is a bare key, not a tenant's: it sees every node and
may drain one (no new sessions there; its sessions are paused) or put it back in service. A
tenant's key gets 403, no key 401. One machine has one node, this gateway's own process.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from gateway.auth import extract_token
from gateway.deps import GatewayDep
from gateway.errors import Forbidden, Unauthorized
from kernel_pool import NodeRecord

router = APIRouter(tags=["nodes"])


async def require_admin(request: Request, gateway: GatewayDep,
                        token: Annotated[str | None, Query(include_in_schema=False)] = None
                        ) -> None:
    key = extract_token(request.headers.get("authorization"), token)
    if not key:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <admin key>'")
    admins = [k.strip() for k in (gateway.settings.admin_keys or "").split(",") if k.strip()]
    if any(hmac.compare_digest(key, admin) for admin in admins):
        return
    await gateway.authenticate(key)  # a wrong key is 401, a tenant's 403
    raise Forbidden("the nodes are for operators: use a key of REPLGATE_ADMIN_KEYS")


AdminDep = Annotated[None, Depends(require_admin)]


@router.get("/v1/nodes")
async def list_nodes(_: AdminDep, gateway: GatewayDep) -> list[NodeRecord]:
    """Every node, with its state, capacity and last heartbeat."""
    return await gateway.nodes()


@router.post("/v1/nodes/{node_id}/drain", status_code=202)
async def drain_node(node_id: str, _: AdminDep, gateway: GatewayDep) -> NodeRecord:
    """No new sessions on the node; each of its sessions is paused (resumed when next used)."""
    return await gateway.set_draining(node_id, True)


@router.post("/v1/nodes/{node_id}/undrain")
async def undrain_node(node_id: str, _: AdminDep, gateway: GatewayDep) -> NodeRecord:
    """The node takes new sessions again."""
    return await gateway.set_draining(node_id, False)

