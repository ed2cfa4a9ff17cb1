"""FastAPI dependencies: the gateway service and the caller's tenant."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query, Request

from gateway.auth import extract_token
from gateway.service import Gateway


async def get_gateway(request: Request) -> Gateway:
    # async: FastAPI runs a plain ``def`` dependency in a worker thread, a hop on every request
    gateway: Gateway = request.app.state.gateway
    return gateway


GatewayDep = Annotated[Gateway, Depends(get_gateway)]


async def get_tenant(request: Request, gateway: GatewayDep,
                     token: Annotated[str | None, Query(include_in_schema=False)] = None) -> str:
    return await gateway.authenticate(extract_token(request.headers.get("authorization"), token))


TenantDep = Annotated[str, Depends(get_tenant)]
