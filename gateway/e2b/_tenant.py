"""The control plane's API key: E2B's ``X-API-Key``, or replgate's ``Authorization: Bearer``,
as the key's tenant (:data:`TenantDep`), or E2B's 401."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from gateway.auth import extract_token
from gateway.deps import GatewayDep
from gateway.e2b._errors import E2BError


async def get_tenant(request: Request, gateway: GatewayDep) -> str:
    key = request.headers.get("x-api-key") or extract_token(
        request.headers.get("authorization"), None)
    try:
        return await gateway.authenticate(key)
    except Exception:
        raise E2BError(401, "missing or wrong API key: set E2B_API_KEY to a replgate API "
                            "key (it is sent as X-API-Key)") from None


TenantDep = Annotated[str, Depends(get_tenant)]
