"""Tenants' secrets: ``PUT``/``DELETE /v1/secrets/{name}`` and ``GET /v1/secrets``
(docs/secrets.md). Write-only: no answer holds a value."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response, status

from gateway.deps import TenantDep
from gateway.secrets import Secrets
from gateway.wire import SecretIn, SecretOut

router = APIRouter(tags=["secrets"])


async def get_secrets(request: Request) -> Secrets:
    secrets: Secrets = request.app.state.secrets
    return secrets


SecretsDep = Annotated[Secrets, Depends(get_secrets)]


@router.put("/v1/secrets/{name}", status_code=status.HTTP_204_NO_CONTENT)
async def put_secret(name: str, body: SecretIn, tenant: TenantDep,
                     secrets: SecretsDep) -> Response:
    """Store a secret, or replace the value of the one of that name (the next request a
    session's rules match uses the new value)."""
    await secrets.put(tenant, name, body.value.get_secret_value())
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/v1/secrets")
async def list_secrets(tenant: TenantDep, secrets: SecretsDep) -> list[SecretOut]:
    """The tenant's secrets: names and times, never a value."""
    return [SecretOut(**record.model_dump()) for record in await secrets.list(tenant)]


@router.delete("/v1/secrets/{name}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_secret(name: str, tenant: TenantDep, secrets: SecretsDep) -> Response:
    """Remove a secret: requests that would use it are refused from now on."""
    await secrets.delete(tenant, name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
