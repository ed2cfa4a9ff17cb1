"""The control plane under ``E2B_API_URL`` (``/e2b``): sandboxes as replgate sessions.

The key arrives as ``X-API-Key`` (E2B's header) or as replgate's ``Authorization: Bearer``.
A template name is a profile name; the SDKs' default templates run on the ``default`` profile.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import parse_qsl, unquote

from fastapi import APIRouter, Depends, Query, Request, Response, status

from gateway.auth import extract_token
from gateway.deps import GatewayDep
from gateway.e2b._errors import E2BError, E2BRoute, unsupported
from gateway.e2b._models import (
    DEFAULT_TEMPLATES,
    ConnectRequest,
    ListedSandbox,
    NewSandbox,
    SandboxDetail,
    SandboxOut,
    TimeoutRequest,
)
from gateway.e2b._sandboxes import Sandboxes
from gateway.service import Gateway
from gateway.wire import SessionCreate
from kernel_pool import Session

router = APIRouter(prefix="/e2b", tags=["e2b"], route_class=E2BRoute)

DEFAULT_TIMEOUT_S = 300
"""E2B's SDKs' default sandbox timeout, used when a create names none."""


async def get_sandboxes(request: Request) -> Sandboxes:
    sandboxes: Sandboxes = request.app.state.e2b
    return sandboxes


SandboxesDep = Annotated[Sandboxes, Depends(get_sandboxes)]


async def get_tenant(request: Request, gateway: GatewayDep) -> str:
    key = request.headers.get("x-api-key") or extract_token(
        request.headers.get("authorization"), None)
    try:
        return await gateway.authenticate(key)
    except Exception:
        raise E2BError(401, "missing or wrong API key: set E2B_API_KEY to a replgate API "
                            "key (it is sent as X-API-Key)") from None


TenantDep = Annotated[str, Depends(get_tenant)]


def _profile(gateway: Gateway, template: str) -> str:
    profiles = [profile.name for profile in gateway.profiles()]
    if template in profiles:
        return template
    if template in DEFAULT_TEMPLATES and "default" in profiles:
        return "default"
    raise E2BError(404, f"template {template!r} not found: on replgate a template is a "
                        f"profile, and the profiles are {', '.join(profiles)}")


def _refuse_unsupported(body: NewSandbox) -> None:
    if body.allow_internet_access:
        raise unsupported("internet access", "replgate sandboxes have no network; leave "
                          "allow_internet_access unset or False")
    if body.network:
        raise unsupported("network rules", "replgate sandboxes have no network at all")
    if body.mcp:
        raise unsupported("MCP servers inside sandboxes",
                          "replgate serves MCP itself at /mcp")
    if body.volume_mounts:
        raise unsupported("volume mounts", "each sandbox has its own workspace at /home/user")
    if body.auto_pause:
        raise unsupported("auto-pause in this version", "leave auto_pause unset")


@router.post("/sandboxes", status_code=status.HTTP_201_CREATED)
@router.post("/v2/sandboxes", status_code=status.HTTP_201_CREATED)
async def create(body: NewSandbox, tenant: TenantDep, gateway: GatewayDep,
                 sandboxes: SandboxesDep) -> SandboxOut:
    """A new sandbox: a replgate session of the key's tenant, on the template's profile."""
    _refuse_unsupported(body)
    profile = _profile(gateway, body.template_id)
    timeout = DEFAULT_TIMEOUT_S if body.timeout is None else body.timeout
    sandboxes.check_timeout(timeout)
    session = await gateway.create_session(tenant, SessionCreate(
        profile=profile, env=body.env_vars, metadata=dict(body.metadata)))
    sandboxes.set_timeout(tenant, session, timeout)
    return sandboxes.created(session)


def _state_filter(state: list[str]) -> set[str]:
    return {s.strip() for item in state for s in item.split(",") if s.strip()}


@router.get("/sandboxes")
@router.get("/v2/sandboxes")
async def list_sandboxes(tenant: TenantDep, gateway: GatewayDep, sandboxes: SandboxesDep,
                         metadata: str | None = None,
                         state: Annotated[list[str], Query()] = []) -> list[ListedSandbox]:  # noqa: B006
    """The tenant's sandboxes, filtered by metadata (``k=v&k2=v2``) and state."""
    # The SDKs quote each key and value before they urlencode the pairs: unquote once more.
    wanted = {unquote(k): unquote(v)
              for k, v in parse_qsl(metadata or "", keep_blank_values=True)}
    states = _state_filter(state)
    found = [sandboxes.listed(s) for s in gateway.sessions(tenant)]
    return [s for s in found
            if all(s.metadata.get(k) == v for k, v in wanted.items())
            and (not states or s.state in states)]


@router.get("/sandboxes/{sandbox_id}")
async def get_sandbox(sandbox_id: str, tenant: TenantDep, gateway: GatewayDep,
                      sandboxes: SandboxesDep) -> SandboxDetail:
    return sandboxes.detail(gateway.session(tenant, sandbox_id))


@router.delete("/sandboxes/{sandbox_id}", status_code=status.HTTP_204_NO_CONTENT)
async def kill(sandbox_id: str, tenant: TenantDep, gateway: GatewayDep) -> Response:
    """``Sandbox.kill()``: the session is deleted, its container and workspace with it."""
    await gateway.delete_session(tenant, sandbox_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/sandboxes/{sandbox_id}/timeout", status_code=status.HTTP_204_NO_CONTENT)
async def set_timeout(sandbox_id: str, body: TimeoutRequest, tenant: TenantDep,
                      gateway: GatewayDep, sandboxes: SandboxesDep) -> Response:
    """The sandbox now ends ``timeout`` seconds from now."""
    sandboxes.set_timeout(tenant, gateway.session(tenant, sandbox_id), body.timeout)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/sandboxes/{sandbox_id}/connect")
@router.post("/v2/sandboxes/{sandbox_id}/connect")
@router.post("/sandboxes/{sandbox_id}/resume")
async def connect(sandbox_id: str, tenant: TenantDep, gateway: GatewayDep,
                  sandboxes: SandboxesDep, body: ConnectRequest | None = None) -> SandboxOut:
    """``Sandbox.connect(id)``: the running sandbox, its timeout extended when one is given;
    a paused one is resumed first (replgate's pause keeps its variables)."""
    session: Session = gateway.session(tenant, sandbox_id)
    if session.paused:
        await gateway.resume(tenant, sandbox_id)
    if body is not None and body.timeout is not None:
        sandboxes.set_timeout(tenant, session, body.timeout)
    return sandboxes.created(session)


@router.post("/sandboxes/{sandbox_id}/pause")
async def pause(sandbox_id: str, tenant: TenantDep, gateway: GatewayDep) -> Response:
    """``Sandbox.beta_pause()``: the session is paused (README: what a pause keeps); connecting
    or running code resumes it."""
    await gateway.pause(tenant, sandbox_id)
    return Response(status_code=204)


@router.get("/sandboxes/{sandbox_id}/metrics")
async def metrics(sandbox_id: str, tenant: TenantDep, gateway: GatewayDep) -> list[object]:
    """No time series is kept: an empty list, as for a sandbox that has just started."""
    gateway.session(tenant, sandbox_id)
    return []


@router.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
                  include_in_schema=False)
async def not_offered(path: str, request: Request, tenant: TenantDep) -> Response:
    raise E2BError(404, f"replgate's E2B-compatible API does not offer {request.method} /{path} "
                        "(custom templates, snapshots, volumes, secrets, logs and network "
                        "rules are not available)")
