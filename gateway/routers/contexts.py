"""A session's code contexts: ``/v1/sessions/{id}/contexts``.

Each context is a kernel of the session's sandbox with its own variables: the session's own
Python kernel (``python``), each language's default context (its id is the language, made by
the first execution in it) and those made here. Executions pick one by ``language`` or
``context_id`` on execute (:meth:`gateway.service.Gateway.submit`).
"""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from gateway.deps import GatewayDep, TenantDep
from gateway.wire import ContextCreate, ContextOut, InterruptOut
from kernel_pool import ContextInfo

router = APIRouter(prefix="/v1/sessions/{session_id}/contexts", tags=["contexts"])


def _out(context: ContextInfo) -> ContextOut:
    return ContextOut.model_validate(context.model_dump())


@router.get("")
async def list_contexts(session_id: str, tenant: TenantDep,
                        gateway: GatewayDep) -> list[ContextOut]:
    """The session's code contexts, its own Python kernel first."""
    session = await gateway.session(tenant, session_id)
    return [_out(context) for context in await session.list_contexts()]


@router.post("", status_code=status.HTTP_201_CREATED)
async def create_context(session_id: str, body: ContextCreate, tenant: TenantDep,
                         gateway: GatewayDep) -> ContextOut:
    """Another kernel of ``language`` in the session (started at its first execution, in the
    folder ``cwd``)."""
    session = await gateway.session(tenant, session_id)
    return _out(await session.create_context(body.language, body.cwd))


@router.post("/{context_id}/restart")
async def restart_context(session_id: str, context_id: str, tenant: TenantDep,
                          gateway: GatewayDep) -> ContextOut:
    """A fresh kernel for the context: its variables go, the workspace and the other
    contexts stay (``python``: the session's own kernel, as a session restart)."""
    session = await gateway.session(tenant, session_id)
    await session.restart_context(context_id)
    return next(_out(c) for c in await session.list_contexts() if c.id == context_id)


@router.post("/{context_id}/interrupt")
async def interrupt_context(session_id: str, context_id: str, tenant: TenantDep,
                            gateway: GatewayDep) -> InterruptOut:
    """Interrupt the execution running in the context, if one does."""
    session = await gateway.session(tenant, session_id)
    return InterruptOut(interrupted=await session.interrupt(context_id))


@router.delete("/{context_id}", status_code=status.HTTP_204_NO_CONTENT)
async def remove_context(session_id: str, context_id: str, tenant: TenantDep,
                         gateway: GatewayDep) -> Response:
    """End the context's kernel and forget it (the session's own ``python`` stays)."""
    session = await gateway.session(tenant, session_id)
    await session.remove_context(context_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)

