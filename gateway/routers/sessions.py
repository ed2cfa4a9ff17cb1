"""Sessions and their executions: ``/v1/sessions``."""

from __future__ import annotations

import contextlib
from typing import Annotated, Any

from fastapi import APIRouter, Body, Response, status

from gateway.deps import GatewayDep, TenantDep
from gateway.wire import (
    CommandRequest,
    CommandResult,
    ExecuteRequest,
    ExecutionOut,
    ExecutionSummary,
    ForkRequest,
    InterruptOut,
    KillOut,
    SessionCreate,
    SessionMetricsOut,
    SessionOut,
)
from kernel_pool import SessionNotFound

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])


@router.post("", status_code=status.HTTP_201_CREATED)
async def create_session(tenant: TenantDep, gateway: GatewayDep,
                         body: Annotated[SessionCreate | None, Body()] = None) -> SessionOut:
    """A new session on a warm kernel; no body at all means every default."""
    return gateway.describe(await gateway.create_session(tenant, body or SessionCreate()))


@router.get("")
async def list_sessions(tenant: TenantDep, gateway: GatewayDep) -> list[SessionOut]:
    """The tenant's sessions as their nodes have them now; one whose node no longer has it
    (another gateway deleting it) is left out, not the whole list a 404."""
    listed = []
    for session in await gateway.sessions(tenant):
        with contextlib.suppress(SessionNotFound):
            listed.append(gateway.describe(await gateway.refresh(session)))
    return listed


@router.get("/{session_id}")
async def get_session(session_id: str, tenant: TenantDep, gateway: GatewayDep) -> SessionOut:
    return gateway.describe(await gateway.refresh(await gateway.session(tenant, session_id)))


@router.get("/{session_id}/metrics")
async def session_metrics(session_id: str, tenant: TenantDep,
                          gateway: GatewayDep) -> SessionMetricsOut:
    """The sandbox's CPU, memory and disk use now; a first request waits a second to measure
    the CPU; a paused session answers its last figures with memory 0."""
    return await gateway.session_metrics(tenant, session_id)


@router.delete("/{session_id}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_session(session_id: str, tenant: TenantDep, gateway: GatewayDep) -> Response:
    """Stop the session; its container and workspace are removed."""
    await gateway.delete_session(tenant, session_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{session_id}/execute")
async def execute(session_id: str, body: ExecuteRequest, tenant: TenantDep,
                  gateway: GatewayDep) -> ExecutionOut:
    """Run code and answer with its result once it ends (stream it on the WebSocket instead);
    in the code context ``context_id`` names, else in ``language``'s (Python's own kernel by
    default)."""
    session = await gateway.session(tenant, session_id)
    return await gateway.execute(tenant, session, body.code, body.timeout_s,
                                 language=body.language, context_id=body.context_id)


@router.post("/{session_id}/commands")
async def run_command(session_id: str, body: CommandRequest, tenant: TenantDep,
                      gateway: GatewayDep) -> CommandResult:
    """Run ``sh -c cmd`` in the session's sandbox beside the kernel; a non-zero exit is data."""
    session = await gateway.session(tenant, session_id)
    return await gateway.run_command(tenant, session, body)


@router.post("/{session_id}/commands/{command_id}/kill")
async def kill_command(session_id: str, command_id: str, tenant: TenantDep,
                       gateway: GatewayDep) -> KillOut:
    """Stop a running command (started with an ``id``) and its process group."""
    session = await gateway.session(tenant, session_id)
    return KillOut(killed=await gateway.kill_command(session, command_id))


@router.post("/{session_id}/interrupt")
async def interrupt(session_id: str, tenant: TenantDep, gateway: GatewayDep) -> InterruptOut:
    return InterruptOut(interrupted=await gateway.interrupt(tenant, session_id))


@router.post("/{session_id}/restart")
async def restart(session_id: str, tenant: TenantDep, gateway: GatewayDep) -> SessionOut:
    """A fresh kernel on the same workspace: variables gone, files kept."""
    return gateway.describe(await gateway.restart(tenant, session_id))


@router.post("/{session_id}/pause")
async def pause(session_id: str, tenant: TenantDep, gateway: GatewayDep) -> SessionOut:
    """Keep the session's state on disk and free its kernel (status ``paused``)."""
    return gateway.describe(await gateway.pause(tenant, session_id))


@router.post("/{session_id}/resume")
async def resume(session_id: str, tenant: TenantDep, gateway: GatewayDep) -> SessionOut:
    """Run a paused session again with its variables (any request that needs it does this)."""
    return gateway.describe(await gateway.resume(tenant, session_id))


@router.post("/{session_id}/fork", status_code=status.HTTP_201_CREATED)
async def fork(session_id: str, tenant: TenantDep, gateway: GatewayDep,
               body: Annotated[ForkRequest | None, Body()] = None) -> list[SessionOut]:
    """New sessions with the session's variables and a copy of its workspace."""
    children = await gateway.fork(tenant, session_id, body or ForkRequest())
    return [gateway.describe(child) for child in children]


@router.get("/{session_id}/executions")
async def history(session_id: str, tenant: TenantDep,
                  gateway: GatewayDep) -> list[ExecutionSummary]:
    """Every execution of the session in order, finished ones with their results."""
    return [ExecutionSummary.model_validate(record, from_attributes=True)
            for record in await gateway.history(tenant, session_id)]


@router.get("/{session_id}/notebook")
async def notebook(session_id: str, tenant: TenantDep, gateway: GatewayDep) -> dict[str, Any]:
    """The session's history as an nbformat v4 notebook, outputs included."""
    return await gateway.notebook(tenant, session_id)
