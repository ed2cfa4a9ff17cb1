"""The control plane under ``E2B_API_URL`` (``/e2b``): sandboxes as replgate sessions.

The key arrives as ``X-API-Key`` (E2B's header) or as replgate's ``Authorization: Bearer``.
A template name is a profile name; the SDKs' default templates run on the ``default`` profile.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response, status

from gateway.deps import GatewayDep
from gateway.e2b._errors import E2BError, E2BRoute, unsupported
from gateway.e2b._lifecycle import asked as lifecycle_asked
from gateway.e2b._listing import Order, page, parse_states, select
from gateway.e2b._models import (
    DEFAULT_TEMPLATES,
    ConnectRequest,
    ForkResult,
    ForkSandbox,
    ListedSandbox,
    NetworkRequest,
    NewSandbox,
    PauseRequest,
    SandboxDetail,
    SandboxOut,
    TimeoutRequest,
)
from gateway.e2b._network import policy_for, refuse_unmappable
from gateway.e2b._sandboxes import Sandboxes
from gateway.e2b._snapshots import SnapshotsDep, sandbox_from_snapshot, snapshot_for
from gateway.e2b._templates_state import custom_template
from gateway.e2b._tenant import TenantDep
from gateway.service import Gateway
from gateway.templates._models import ID_PREFIX as TEMPLATE_ID_PREFIX
from gateway.wire import ForkRequest, SessionCreate
from kernel_pool import SessionPort, SessionStatus

router = APIRouter(prefix="/e2b", tags=["e2b"], route_class=E2BRoute)

DEFAULT_TIMEOUT_S = 300
"""E2B's SDKs' default sandbox timeout, used when a create names none."""


async def get_sandboxes(request: Request) -> Sandboxes:
    sandboxes: Sandboxes = request.app.state.e2b
    return sandboxes


SandboxesDep = Annotated[Sandboxes, Depends(get_sandboxes)]


def _profile(gateway: Gateway, template: str) -> str:
    # a custom template's profiles are its tenant's: found by custom_template, never here
    profiles = [profile.name for profile in gateway.profiles()
                if not profile.name.startswith(TEMPLATE_ID_PREFIX)]
    if template in profiles:
        return template
    if template in DEFAULT_TEMPLATES and "default" in profiles:
        return "default"
    raise E2BError(404, f"template {template!r} not found: on replgate a template is a "
                        f"profile, and the profiles are {', '.join(profiles)}")


def _refuse_unsupported(body: NewSandbox) -> None:
    """Refuse what a create asks for that replgate cannot give. ``allow_internet_access``,
    ``network.allow_out`` and ``deny_out`` map onto the session's network policy
    (:mod:`._network`); ``network.allow_public_traffic`` is no refusal either: the traffic
    token it is about is always required here, and the answer says so. Nor is ``mcp``: as on
    E2B, the SDK itself starts the MCP gateway in the new sandbox (``mcp-gateway``), which
    replgate's images lack, so the SDK's create fails there and kills the sandbox."""
    if body.network is not None:
        refuse_unmappable(body.network.rules)
    if body.volume_mounts:
        raise unsupported("volume mounts", "each sandbox has its own workspace at /home/user")


@router.post("/sandboxes", status_code=status.HTTP_201_CREATED)
@router.post("/v2/sandboxes", status_code=status.HTTP_201_CREATED)
async def create(body: NewSandbox, tenant: TenantDep, gateway: GatewayDep,
                 sandboxes: SandboxesDep, snapshots: SnapshotsDep,
                 request: Request) -> SandboxOut:
    """A new sandbox: a replgate session of the key's tenant, on the template's profile (a
    custom template's: :mod:`._templates_state`; or made from the snapshot the template names:
    :mod:`._snapshots`)."""
    _refuse_unsupported(body)
    timeout = DEFAULT_TIMEOUT_S if body.timeout is None else body.timeout
    snapshot = await snapshot_for(snapshots, tenant, body.template_id)
    if snapshot is not None:
        return await sandbox_from_snapshot(snapshot, body, tenant, timeout, snapshots,
                                           sandboxes)
    template = await custom_template(request, tenant, body.template_id)
    profile = template.profile if template else _profile(gateway, body.template_id)
    sandboxes.check_timeout(timeout)
    policy = lifecycle_asked(body, timeout)
    asked = body.network or NetworkRequest()
    network = policy_for(gateway.pool.profile(profile), asked.allow_out, asked.deny_out,
                         body.allow_internet_access, asked.rules.get("rules"))
    session = await gateway.create_session(tenant, SessionCreate(
        profile=profile, env=body.env_vars, metadata=dict(body.metadata), network=network))
    await sandboxes.set_lifecycle(tenant, session, policy)
    await sandboxes.set_timeout(tenant, session, timeout)
    return sandboxes.created(session)


async def _listed(gateway: Gateway, sandboxes: Sandboxes, tenant: str, metadata: str | None,
            state: list[str], started_after: datetime | None = None,
            template: str | None = None) -> list[ListedSandbox]:
    if started_after is not None and started_after.tzinfo is None:
        started_after = started_after.replace(tzinfo=UTC)
    return select(await sandboxes.listed(await gateway.sessions(tenant)), metadata=metadata,
                  state=state, started_after=started_after, template=template)


StateQuery = Annotated[list[str], Query(description="running, paused, or both")]


@router.get("/sandboxes")
async def list_sandboxes(tenant: TenantDep, gateway: GatewayDep, sandboxes: SandboxesDep,
                         metadata: str | None = None,
                         state: StateQuery = []) -> list[ListedSandbox]:  # noqa: B006
    """The tenant's sandboxes, filtered by metadata (``k=v&k2=v2``) and state, unpaged."""
    return await _listed(gateway, sandboxes, tenant, metadata, state)


@router.get("/v2/sandboxes")
async def list_sandboxes_v2(
        response: Response, tenant: TenantDep, gateway: GatewayDep, sandboxes: SandboxesDep,
        metadata: str | None = None, state: StateQuery = [],  # noqa: B006
        order: Order = "desc", started_after: Annotated[datetime | None, Query(
            alias="startedAfter")] = None, template: str | None = None,
        limit: Annotated[int, Query(ge=1, le=100)] = 100,
        next_token: Annotated[str | None, Query(alias="nextToken")] = None,
) -> list[ListedSandbox]:
    """``Sandbox.list()``: one page of the tenant's sandboxes, filtered, newest first unless
    ``order=asc``; ``X-Next-Token`` when another page follows, and ``X-Total-Running``."""
    found = await _listed(gateway, sandboxes, tenant, metadata, state, started_after, template)
    items, token = page(found, order=order, limit=limit, next_token=next_token)
    if token is not None:
        response.headers["X-Next-Token"] = token
    if not state or "running" in parse_states(state):
        response.headers["X-Total-Running"] = str(sum(s.state == "running" for s in found))
    return items


@router.get("/sandboxes/{sandbox_id}")
async def get_sandbox(sandbox_id: str, tenant: TenantDep, gateway: GatewayDep,
                      sandboxes: SandboxesDep) -> SandboxDetail:
    return await sandboxes.detail(await gateway.session(tenant, sandbox_id))


@router.delete("/sandboxes/{sandbox_id}", status_code=status.HTTP_204_NO_CONTENT)
async def kill(sandbox_id: str, tenant: TenantDep, gateway: GatewayDep) -> Response:
    """``Sandbox.kill()``: the session is deleted, its container and workspace with it."""
    await gateway.delete_session(tenant, sandbox_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/sandboxes/{sandbox_id}/timeout", status_code=status.HTTP_204_NO_CONTENT)
async def set_timeout(sandbox_id: str, body: TimeoutRequest, tenant: TenantDep,
                      gateway: GatewayDep, sandboxes: SandboxesDep) -> Response:
    """The sandbox now ends ``timeout`` seconds from now."""
    await sandboxes.set_timeout(tenant, await gateway.session(tenant, sandbox_id), body.timeout)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


RESUME_TIMEOUT_S = 15
"""The timeout of a sandbox resumed by the deprecated ``/resume`` naming none (E2B's
``ResumedSandbox`` default)."""


async def _wake(tenant: str, session: SessionPort, gateway: Gateway, memory: bool) -> None:
    """Resume a paused sandbox; ``memory=False`` (E2B's reboot) starts it from its files
    alone, its variables dropped."""
    await gateway.resume(tenant, session.id)
    if not memory:
        await gateway.restart(tenant, session.id)


@router.post("/sandboxes/{sandbox_id}/connect")
@router.post("/v2/sandboxes/{sandbox_id}/connect")
async def connect(sandbox_id: str, tenant: TenantDep, gateway: GatewayDep,
                  sandboxes: SandboxesDep, body: ConnectRequest | None = None) -> Response:
    """``Sandbox.connect(id)``: 200 with the running sandbox, its end moved to ``timeout``
    seconds from now unless it ends later; 201 when a paused one was resumed first (replgate's
    pause keeps its variables) and ends ``timeout`` seconds from now."""
    body = body or ConnectRequest()
    session: SessionPort = await gateway.session(tenant, sandbox_id)
    timeout = DEFAULT_TIMEOUT_S if body.timeout is None else body.timeout
    sandboxes.check_timeout(timeout)
    if session.state().status is SessionStatus.PAUSED:
        await _wake(tenant, session, gateway, body.memory)
        await sandboxes.set_timeout(tenant, session, timeout)
        return _sandbox_json(sandboxes.created(session), status.HTTP_201_CREATED)
    await sandboxes.extend(tenant, session, timeout)
    return _sandbox_json(sandboxes.created(session), status.HTTP_200_OK)


@router.post("/sandboxes/{sandbox_id}/resume", status_code=status.HTTP_201_CREATED)
async def resume(sandbox_id: str, tenant: TenantDep, gateway: GatewayDep,
                 sandboxes: SandboxesDep, body: ConnectRequest | None = None) -> SandboxOut:
    """The deprecated resume: a paused sandbox only (409 for a running one)."""
    body = body or ConnectRequest()
    session: SessionPort = await gateway.session(tenant, sandbox_id)
    timeout = RESUME_TIMEOUT_S if body.timeout is None else body.timeout
    sandboxes.check_timeout(timeout)
    if session.state().status is not SessionStatus.PAUSED:
        raise E2BError(409, f"Sandbox {sandbox_id} is already running")
    await _wake(tenant, session, gateway, body.memory)
    await sandboxes.set_timeout(tenant, session, timeout)
    return sandboxes.created(session)


def _sandbox_json(sandbox: SandboxOut, status_code: int) -> Response:
    return Response(sandbox.model_dump_json(), status_code=status_code,
                    media_type="application/json")


@router.post("/sandboxes/{sandbox_id}/pause", status_code=status.HTTP_204_NO_CONTENT)
async def pause(sandbox_id: str, tenant: TenantDep, gateway: GatewayDep,
                sandboxes: SandboxesDep, body: PauseRequest | None = None) -> Response:
    """``Sandbox.pause()``: the session is paused (docs/lifecycle.md: what a pause keeps) and stops
    expiring; connecting or running code resumes it. ``memory: false`` keeps the files only
    (the kernel is restarted first, so nothing of its memory is kept). 409 when it already is
    paused, which the SDKs read as ``False``."""
    session: SessionPort = await gateway.session(tenant, sandbox_id)
    if session.state().status is SessionStatus.PAUSED:
        raise E2BError(409, f"Sandbox {sandbox_id} is already paused")
    if body is not None and not body.memory:
        await gateway.restart(tenant, sandbox_id)
    await gateway.pause(tenant, sandbox_id)
    await sandboxes.paused(tenant, session)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/sandboxes/{sandbox_id}/fork", status_code=status.HTTP_201_CREATED)
async def fork(sandbox_id: str, tenant: TenantDep, gateway: GatewayDep, sandboxes: SandboxesDep,
               body: ForkSandbox | None = None) -> list[ForkResult]:
    """``Sandbox.fork()``: replgate's fork (docs/lifecycle.md: the variables and a copy of the
    files; the parent goes on unchanged), each fork with the parent's metadata and ending
    ``timeout`` seconds from now. replgate forks all or none: a failure is the request's,
    and a count past replgate's limit (16; E2B's is 20) is a 400 that names it."""
    body = body or ForkSandbox()
    sandboxes.check_timeout(body.timeout)
    parent = await gateway.session(tenant, sandbox_id)
    request = ForkRequest(count=body.count, metadata=dict(parent.state().metadata))
    children = await gateway.fork(tenant, sandbox_id, request)
    for child in children:
        await sandboxes.set_timeout(tenant, child, body.timeout)
    return [ForkResult(sandbox=sandboxes.created(child)) for child in children]


@router.get("/sandboxes/{sandbox_id}/metrics")
async def metrics(sandbox_id: str, tenant: TenantDep, gateway: GatewayDep,
                  start: Annotated[int | None, Query(ge=0)] = None,
                  end: Annotated[int | None, Query(ge=0)] = None) -> list[dict[str, object]]:
    """``Sandbox.get_metrics(start, end)``: the readings replgate took in that range (Unix
    seconds, ``end``'s whole second included), oldest first. replgate reads a sandbox when
    asked (``GET /v1/sessions/{id}/metrics``; :mod:`gateway.usage` keeps the readings), so a
    range that reaches now takes a reading now. ``cpuCount`` is the CPU limit rounded up;
    ``memCache`` is 0: the page cache is counted in ``memUsed``, as the limit counts it."""
    if start is not None and end is not None and start > end:
        raise E2BError(400, f"start ({start}) must not be after end ({end})")
    session = await gateway.session(tenant, sandbox_id)
    if end is None or end + 1 >= time.time():
        await gateway.session_metrics(tenant, sandbox_id)
    cpus = max(1, math.ceil(session.profile.cpus))
    return [{"timestamp": figures.at,
             "timestampUnix": int(datetime.fromisoformat(figures.at).timestamp()),
             "cpuCount": cpus, "cpuUsedPct": figures.cpu_used_pct,
             "memUsed": figures.mem_used_bytes, "memTotal": figures.mem_limit_bytes,
             "memCache": 0, "diskUsed": figures.disk_used_bytes,
             "diskTotal": figures.disk_limit_bytes}
            for figures in gateway.usage.history(
                session.id, start, None if end is None else end + 1)]


@router.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
                  include_in_schema=False)
async def not_offered(path: str, request: Request, tenant: TenantDep) -> Response:
    raise E2BError(404, f"replgate's E2B-compatible API does not offer {request.method} /{path} "
                        "(volumes and logs are not available)")
