"""A session's code contexts: ``/v1/sessions/{id}/contexts``.

Each context is a kernel of the session's sandbox with its own variables: the session's own
Python kernel (``python``), each language's default context (its id is the language, made by
the first execution in it) and those made here. Executions pick one by ``language`` or
``context_id`` (:func:`in_context`).
"""

from __future__ import annotations

from typing import Any, cast

from fastapi import APIRouter, Response, status

from gateway.deps import GatewayDep, TenantDep
from gateway.wire import ContextCreate, ContextOut, InterruptOut
from kernel_pool import ContextInfo, ExecutionHandle, Gate, SessionPort

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
    """Another kernel of ``language`` in the session (started at its first execution)."""
    session = await gateway.session(tenant, session_id)
    return _out(await session.create_context(body.language))


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


class _InContext:
    """A session whose ``submit`` sends code to one context: what ``Gateway.submit`` is
    given while it takes no language of its own. Everything else is the session's."""

    def __init__(self, session: SessionPort, language: str | None,
                 context_id: str | None) -> None:
        self._session = session
        self._language = language
        self._context_id = context_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def submit(self, code: str, timeout_s: float | None = None,
               execution_id: str | None = None, gate: Gate | None = None) -> ExecutionHandle:
        return self._session.submit(code, timeout_s, execution_id, gate,
                                    language=self._language, context_id=self._context_id)


def in_context(session: SessionPort, language: str | None,
               context_id: str | None) -> SessionPort:
    """``session``, its executions sent to ``context_id``'s context, else to ``language``'s
    default one (both None: the session itself, Python's own kernel)."""
    if language is None and context_id is None:
        return session
    return cast(SessionPort, _InContext(session, language, context_id))
