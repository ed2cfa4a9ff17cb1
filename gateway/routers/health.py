"""Unauthenticated endpoints: liveness and aggregate metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response

from gateway import __version__
from gateway.deps import GatewayDep
from gateway.wire import Health

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz(gateway: GatewayDep) -> Health:
    return Health(status="ok", version=__version__, pool=gateway.pool.stats())


@router.get("/metrics")
async def metrics(gateway: GatewayDep) -> Response:
    """Prometheus text: pool and execution figures, nothing per tenant."""
    return Response(gateway.metrics.render(), media_type="text/plain; version=0.0.4")
