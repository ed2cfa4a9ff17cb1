"""Jupyter's kernel API, in Jupyter Kernel Gateway's shape: ``/api/...`` (routes only).

A kernel is a session of the caller's tenant: started through ``Gateway.create_session``,
listed by ``/v1/sessions`` too, and another tenant's is a 404. Profiles are the kernelspecs,
the default profile named ``python3``. Auth is the API's: ``Authorization: token <key>``
(jupyter_server's gateway client), ``Bearer <key>`` or ``?token=<key>``; a kernel's start, get
and restart also leave a pass onto its channels for a client that sends no key there
(:mod:`gateway.jupyter._passes`).
``/api/kernels/{id}/channels`` speaks Jupyter's kernel WebSocket protocol, JSON or the
``v1.kernel.websocket.jupyter.org`` binary subprotocol (:mod:`gateway.jupyter`).
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request, Response, WebSocket, status

from gateway import __version__
from gateway.deps import GatewayDep, TenantDep
from gateway.jupyter import (
    DEFAULT_KERNEL,
    KERNEL_LANGUAGE_KEY,
    JupyterRoute,
    channel_passes,
    find_kernelspec,
    kernel_model,
    kernelspec,
    kernelspecs,
    peer,
    serve_channels,
)
from gateway.jupyter import interrupt_kernel as interrupt_kernel_of
from gateway.jupyter import restart_kernel as restart_kernel_of
from gateway.wire import KernelCreate, KernelModel, SessionCreate

router = APIRouter(tags=["jupyter"], route_class=JupyterRoute)


@router.get("/api")
async def api_version(tenant: TenantDep) -> dict[str, str]:
    return {"version": __version__}


@router.get("/api/kernelspecs")
async def list_kernelspecs(tenant: TenantDep, gateway: GatewayDep) -> dict[str, Any]:
    return await kernelspecs(gateway, tenant)


@router.get("/api/kernelspecs/{name}")
async def get_kernelspec(name: str, tenant: TenantDep, gateway: GatewayDep) -> dict[str, Any]:
    return kernelspec(*await find_kernelspec(gateway, name, tenant))


@router.get("/api/kernels")
async def list_kernels(request: Request, tenant: TenantDep,
                       gateway: GatewayDep) -> list[KernelModel]:
    return [kernel_model(s, request.app) for s in await gateway.sessions(tenant)]


@router.post("/api/kernels", status_code=status.HTTP_201_CREATED)
async def start_kernel(request: Request, response: Response, tenant: TenantDep,
                       gateway: GatewayDep, body: KernelCreate | None = None) -> KernelModel:
    """A new session on a warm kernel; ``env`` reaches the kernel as given. Another
    language's kernelspec gives a session whose executions run in that language's context."""
    body = body or KernelCreate()
    profile, language = await find_kernelspec(gateway, body.name or DEFAULT_KERNEL, tenant)
    metadata = {} if language == "python" else {KERNEL_LANGUAGE_KEY: language}
    session = await gateway.create_session(
        tenant, SessionCreate(profile=profile.name, env=body.env, metadata=metadata),
        session_id=str(uuid.uuid4()))
    response.headers["Location"] = f"/api/kernels/{session.id}"
    channel_passes(request.app).grant(session.id, tenant, peer(request))
    return kernel_model(session, request.app)


@router.get("/api/kernels/{kernel_id}")
async def get_kernel(kernel_id: str, request: Request, tenant: TenantDep,
                     gateway: GatewayDep) -> KernelModel:
    model = kernel_model(await gateway.session(tenant, kernel_id), request.app)
    channel_passes(request.app).grant(kernel_id, tenant, peer(request))
    return model


@router.delete("/api/kernels/{kernel_id}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_kernel(kernel_id: str, request: Request, tenant: TenantDep,
                        gateway: GatewayDep) -> Response:
    await gateway.delete_session(tenant, kernel_id)
    channel_passes(request.app).revoke(kernel_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/api/kernels/{kernel_id}/interrupt", status_code=status.HTTP_204_NO_CONTENT)
async def interrupt_kernel(kernel_id: str, tenant: TenantDep, gateway: GatewayDep) -> Response:
    await interrupt_kernel_of(gateway, tenant, await gateway.session(tenant, kernel_id))
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/api/kernels/{kernel_id}/restart")
async def restart_kernel(kernel_id: str, request: Request, tenant: TenantDep,
                         gateway: GatewayDep) -> KernelModel:
    """A fresh kernel on the same workspace: variables gone, files kept."""
    session = await restart_kernel_of(gateway, tenant, await gateway.session(tenant, kernel_id))
    model = kernel_model(session, request.app)
    channel_passes(request.app).grant(kernel_id, tenant, peer(request))
    return model


@router.websocket("/api/kernels/{kernel_id}/channels")
async def kernel_channels(websocket: WebSocket, kernel_id: str) -> None:
    await serve_channels(websocket, kernel_id)
