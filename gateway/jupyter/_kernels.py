"""Jupyter's view of replgate: profiles as kernelspecs, sessions as kernels, its error shape.

A kernel is a session of the caller's tenant (ids are dashed UUIDs, which jupyter_server's URL
patterns require); the default profile is the kernelspec ``python3``. Each other language a
profile's image offers is a kernelspec too, named as its own kernel's (``ir``, ``deno``,
``bash``; another profile's prefixed: ``big-ir``): a kernel of it is a session whose
executions run in that language's context (:data:`KERNEL_LANGUAGE_KEY` in its metadata).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request, Response, WebSocket
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from gateway.auth import extract_token, origin_allowed
from gateway.errors import (
    DOMAIN_ERRORS,
    NotFound,
    Unauthorized,
    detail_for,
    error_response,
    status_for,
)
from gateway.jupyter._channels import KernelChannels
from gateway.jupyter._languages import (
    KERNEL_LANGUAGE_KEY,
    LANGUAGE_SPECS,
    interrupt_kernel,
    kernel_language,
    restart_kernel,
)
from gateway.jupyter._passes import PASS_TTL_S, channel_passes, peer
from gateway.jupyter.protocol import V1_SUBPROTOCOL
from gateway.profiles import TEMPLATE_PREFIX
from gateway.service import Gateway
from gateway.wire import KernelModel
from kernel_pool import Profile, SessionPort, SessionStatus

__all__ = ["DEFAULT_KERNEL", "KERNEL_LANGUAGE_KEY", "JupyterRoute", "find_kernelspec",
           "interrupt_kernel", "kernel_language", "kernel_model", "kernelspec", "kernelspecs",
           "restart_kernel", "serve_channels"]

logger = logging.getLogger(__name__)

DEFAULT_KERNEL = "python3"
NO_KEY_ON_CHANNELS = (
    "missing API key: send 'Authorization: token <key>' (or Bearer, or ?token=<key>); a client "
    "that cannot (jupyter_server's GatewayKernelClient) is let in once, within "
    f"{PASS_TTL_S:.0f} s of its own authenticated request for this kernel, from the same address")


class JupyterRoute(APIRoute):
    """Errors also carry Kernel Gateway's ``reason`` and ``message``, which jupyter_server shows."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except DOMAIN_ERRORS as exc:
                code = status_for(exc)
                if code >= 500:
                    raise  # the app's handler logs it
                return error_response(exc, message=str(detail_for(exc)),
                                      reason=HTTPStatus(code).phrase)

        return route


def kernel_name(profile: str, language: str = "python") -> str:
    """The kernelspec of ``language`` in ``profile``'s sessions."""
    if language == "python":
        return DEFAULT_KERNEL if profile == "default" else profile
    own = LANGUAGE_SPECS[language].name
    return own if profile == "default" else f"{profile}-{own}"


def kernelspec(profile: Profile, language: str = "python") -> dict[str, Any]:
    label = "sandbox" if profile.name == "default" else profile.name
    metadata = {"replgate": {"profile": profile.name, "language": language,
                             "memory": profile.memory, "cpus": profile.cpus,
                             "timeout_s": profile.default_timeout_s,
                             "max_timeout_s": profile.max_timeout_s}}
    if language == "python":
        spec: dict[str, Any] = {
            "argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": f"Python 3 (replgate {label})", "language": "python",
            "interrupt_mode": "message"}
    else:
        own = LANGUAGE_SPECS[language]
        spec = {"argv": own.argv, "display_name": f"{own.display_name} (replgate {label})",
                "language": own.language, "interrupt_mode": own.interrupt_mode}
    return {"name": kernel_name(profile.name, language), "resources": {},
            "spec": {**spec, "env": {}, "metadata": metadata}}


async def profile_languages(gateway: Gateway, profile: Profile) -> list[str]:
    """The kernels ``profile``'s sessions offer, Python first (TypeScript runs in Deno's, so
    it has none of its own). A gateway of nodes cannot tell their image's languages before a
    session exists: Python's alone, which every image has."""
    offered = await gateway.pool.languages(profile.name)
    if offered is None:
        return ["python"]
    return ["python", *(name for name in offered if name in LANGUAGE_SPECS)]


async def tenant_profiles(gateway: Gateway, tenant: str) -> list[Profile]:
    """The profiles a tenant's kernelspecs name: the operator's, and the current build of each
    custom template the tenant may use (not another tenant's, nor an earlier build)."""
    if gateway.templates is None:
        return gateway.profiles()
    usable = await gateway.templates.profiles_of(tenant)
    return [profile for profile in gateway.profiles()
            if not profile.name.startswith(TEMPLATE_PREFIX) or profile.name in usable]


async def kernelspecs(gateway: Gateway, tenant: str) -> dict[str, Any]:
    specs = [kernelspec(profile, language) for profile in await tenant_profiles(gateway, tenant)
             for language in await profile_languages(gateway, profile)]
    return {"default": DEFAULT_KERNEL, "kernelspecs": {spec["name"]: spec for spec in specs}}


async def find_kernelspec(gateway: Gateway, name: str, tenant: str) -> tuple[Profile, str]:
    """The profile and language a kernelspec name stands for; :class:`NotFound` for an
    unknown one."""
    for profile in await tenant_profiles(gateway, tenant):
        for language in await profile_languages(gateway, profile):
            if kernel_name(profile.name, language) == name:
                return profile, language
    raise NotFound(f"no kernelspec named {name!r}; GET /api/kernelspecs lists them")


def connections(app: FastAPI) -> Counter[str]:
    """Open channel WebSockets per kernel (the model's ``connections``)."""
    counter: Counter[str] | None = getattr(app.state, "jupyter_connections", None)
    if counter is None:
        counter = app.state.jupyter_connections = Counter()
    return counter


def kernel_model(session: SessionPort, app: FastAPI) -> KernelModel:
    state = session.state()
    active = datetime.fromisoformat(state.last_active_at).astimezone(UTC)
    return KernelModel(id=session.id,
                       name=kernel_name(session.profile.name, kernel_language(session)),
                       last_activity=active.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                       # Jupyter knows no "paused": such a kernel is idle, resumed on use.
                       execution_state="idle" if state.status is SessionStatus.PAUSED
                       else state.status.value,
                       connections=connections(app)[session.id])


async def serve_channels(websocket: WebSocket, kernel_id: str) -> None:
    """Check origin, key and kernel, then serve the channels until the client leaves."""
    gateway: Gateway = websocket.app.state.gateway
    if not origin_allowed(websocket.headers, gateway.settings.allowed_origins):
        await _refuse(websocket, 403, "origin not allowed")
        return
    token = extract_token(websocket.headers.get("authorization"),
                          websocket.query_params.get("token"))
    try:
        tenant = (channel_passes(websocket.app).take(kernel_id, peer(websocket))
                  if token is None else None)
        if tenant is None:
            if token is None:
                raise Unauthorized(NO_KEY_ON_CHANNELS)
            tenant = await gateway.authenticate(token)
        else:
            logger.info("kernel %s: channels opened without a key, on the pass of tenant %s's "
                        "request for it (jupyter_server's GatewayKernelClient sends none)",
                        kernel_id, tenant)
        session = await gateway.session(tenant, kernel_id)
    except DOMAIN_ERRORS as exc:
        await _refuse(websocket, status_for(exc), str(detail_for(exc)))
        return
    binary = V1_SUBPROTOCOL in websocket.scope.get("subprotocols", [])
    await websocket.accept(subprotocol=V1_SUBPROTOCOL if binary else None)
    counter = connections(websocket.app)
    counter[session.id] += 1
    try:
        await KernelChannels(websocket, gateway, tenant, session, binary,
                             kernel_language(session)).serve()
    finally:
        counter[session.id] -= 1
        if counter[session.id] <= 0:
            del counter[session.id]


async def _refuse(websocket: WebSocket, code: int, detail: str) -> None:
    """Refuse the upgrade with an HTTP status (a plain 403 where the server cannot)."""
    try:
        await websocket.send_denial_response(JSONResponse({"detail": detail}, status_code=code))
    except RuntimeError:
        await websocket.close(code=1008, reason=detail[:120])
