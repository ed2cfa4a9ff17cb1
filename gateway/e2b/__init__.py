"""E2B-compatible API: E2B's own SDKs, unmodified, drive replgate sessions.

Three environment variables point them here (README, "Coming from E2B"):
``E2B_API_URL=http://HOST:PORT/e2b`` (the control plane, :mod:`._control`),
``E2B_SANDBOX_URL=http://HOST:PORT/e2b/sandbox`` (in-sandbox calls, routed by the
``E2b-Sandbox-Id`` and ``E2b-Sandbox-Port`` headers: the code interpreter, :mod:`._interpreter`,
and envd's files and RPC services, :mod:`._envd`, :mod:`._filesystem`, :mod:`._process`) and
``E2B_API_KEY=<a replgate API key>``. Releases before those variables reach E2B's host names
(``api.DOMAIN``, ``PORT-ID.DOMAIN``): :mod:`._hosts` serves them when ``REPLGATE_E2B_DOMAIN`` is
set.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.routing import Mount, Route

from gateway.e2b import (
    _control,
    _envd,
    _interpreter,
    _network,
    _secrets,
    _snapshots,
    _templates,
    _templates_catalog,
)
from gateway.e2b._connect import SandboxRpc
from gateway.e2b._filesystem import SERVICE as FILESYSTEM
from gateway.e2b._filesystem import filesystem_service
from gateway.e2b._hosts import E2BHosts
from gateway.e2b._process import process_service
from gateway.e2b._sandboxes import Sandboxes
from gateway.e2b._templates_files import Uploads
from gateway.e2b._templates_state import TemplateBuilds
from gateway.e2b._watch import watch_endpoints
from gateway.service import Gateway
from kernel_pool import open_store

__all__ = ["Sandboxes", "install", "start"]


def install(app: FastAPI, domain: str | None = None) -> None:
    """Add the E2B routes: the sandbox plane first, since the control plane's catch-all
    (``/e2b/{path}``) would otherwise answer for it. ``/execute`` goes first of all the app's
    routes: the router tries them in order, and it is every ``run_code``. With ``domain``
    (``REPLGATE_E2B_DOMAIN``), E2B's host names under it reach them too (:mod:`._hosts`)."""
    if domain is not None:
        app.add_middleware(E2BHosts, domain=domain)
    app.router.routes.insert(0, Route("/e2b/sandbox/execute", _interpreter.execute,
                                      methods=["POST"], include_in_schema=False))
    rpc = SandboxRpc(filesystem_service(*watch_endpoints(FILESYSTEM)), process_service())
    for name in rpc.services:
        app.router.routes.append(Mount(f"/e2b/sandbox/{name}", app=rpc))
    app.include_router(_interpreter.router)
    app.include_router(_envd.router)
    app.include_router(_templates.router)  # before the control plane's catch-all
    app.include_router(_templates.uploads_router)  # (the same)
    app.include_router(_templates_catalog.router)  # (the same, and before the snapshots')
    app.include_router(_snapshots.router)  # before the control plane's catch-all
    app.include_router(_network.router)  # (the same)
    app.include_router(_secrets.router)  # (the same)
    app.include_router(_control.router)


async def start(app: FastAPI, gateway: Gateway) -> None:
    """Make the E2B state of a started gateway (call from the lifespan)."""
    sandboxes = Sandboxes(gateway)
    await sandboxes.start()
    app.state.e2b = sandboxes
    app.state.e2b_templates = TemplateBuilds(
        Uploads(gateway.settings.state_dir / "e2b-uploads", sandboxes.sign,
                open_store(gateway.settings.bundle_store) if gateway.settings.bundle_store
                else None), gateway.store)
