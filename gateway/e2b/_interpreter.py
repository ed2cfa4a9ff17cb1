"""E2B's code interpreter (port 49999) on a session's kernel: ``/execute`` and ``/contexts``.

``/execute`` answers a stream of JSON lines as the code runs (:mod:`gateway.e2b._stream`),
bounded on the server by the profile's maximum timeout. A sandbox has one context, its Python
kernel: it is listed and can be restarted, but no second one can be made.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict

from gateway.e2b._access import ENVD_PORT, INTERPRETER_PORT, find_sandbox, services
from gateway.e2b._errors import E2BError, PlainTextRoute, answer, unsupported
from gateway.e2b._paths import HOME
from gateway.e2b._stream import ExecutionStream
from kernel_pool import SessionPort

router = APIRouter(prefix="/e2b/sandbox", tags=["e2b"], route_class=PlainTextRoute,
                   include_in_schema=False)


class ExecuteRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    code: str
    context_id: str | None = None
    language: str | None = None
    env_vars: dict[str, str] | None = None


class CreateContext(BaseModel):
    model_config = ConfigDict(extra="ignore")
    language: str | None = None
    cwd: str | None = None


def _context(session: SessionPort) -> dict[str, str]:
    return {"id": session.id, "language": "python", "cwd": HOME}


def _env_code(env: dict[str, str]) -> tuple[str, str]:
    """Code that sets ``env`` in the kernel's ``os.environ``, and code that puts it back."""
    setup = ("import os as __e2b_os\n"
             f"__e2b_saved = {{k: __e2b_os.environ.get(k) for k in {sorted(env)!r}}}\n"
             f"__e2b_os.environ.update({env!r})")
    restore = ("for __e2b_k, __e2b_v in __e2b_saved.items():\n"
               "    if __e2b_v is None: __e2b_os.environ.pop(__e2b_k, None)\n"
               "    else: __e2b_os.environ[__e2b_k] = __e2b_v\n"
               "del __e2b_saved, __e2b_os")
    return setup, restore


async def execute(request: Request) -> Response:
    """``POST /execute``: run code in the sandbox's kernel, answering its events as they happen.

    A bare Starlette route, first in the app's routes (:func:`gateway.e2b.install`): it is
    every ``run_code``, and FastAPI's matching of a dozen routes and its dependency solving
    were the largest part of this request's gateway CPU (profiled).
    """
    try:
        body = ExecuteRequest.model_validate_json(await request.body())
        return await _submit(request, body)
    except Exception as exc:
        return answer(exc, request, PlainTextRoute.render)


async def _submit(request: Request, body: ExecuteRequest) -> Response:
    gateway, sandboxes = services(request)
    tenant, session = await find_sandbox(request.headers, gateway, sandboxes, INTERPRETER_PORT)
    if body.context_id and body.language:
        raise E2BError(400, "Only one of context_id or language can be provided")
    if body.language and body.language.strip().lower() not in ("python", "python3"):
        raise unsupported(f"the language {body.language!r}", "replgate runs Python only")
    if body.context_id and body.context_id != session.id:
        raise E2BError(404, f"Context {body.context_id} not found")
    timeout = session.profile.max_timeout_s
    env = {k: v for k, v in (body.env_vars or {}).items() if k}
    restore = None
    if env:
        setup, restore = _env_code(env)
        gateway.submit(tenant, session, setup, timeout)
    handle = gateway.submit(tenant, session, body.code, timeout)
    if restore is not None:
        gateway.submit(tenant, session, restore, timeout)
    return ExecutionStream(session, handle)


@router.get("/contexts")
async def list_contexts(request: Request) -> list[dict[str, str]]:
    gateway, sandboxes = services(request)
    _, session = await find_sandbox(request.headers, gateway, sandboxes, INTERPRETER_PORT)
    return [_context(session)]


@router.post("/contexts")
async def create_context(body: CreateContext, request: Request) -> dict[str, Any]:
    gateway, sandboxes = services(request)
    await find_sandbox(request.headers, gateway, sandboxes, INTERPRETER_PORT)
    raise unsupported("a second code context in one sandbox",
                      "each sandbox has one Python context (its kernel); use run_code without "
                      "a context, or create another sandbox for separate state")


async def _the_context(request: Request, context_id: str) -> tuple[str, SessionPort]:
    """The sandbox whose one context ``context_id`` names (404 for any other id)."""
    gateway, sandboxes = services(request)
    tenant, session = await find_sandbox(request.headers, gateway, sandboxes, INTERPRETER_PORT)
    if context_id != session.id:
        raise E2BError(404, f"Context {context_id} not found")
    return tenant, session


@router.post("/contexts/{context_id}/restart")
async def restart_context(context_id: str, request: Request) -> None:
    """Restart the kernel: variables gone, files kept."""
    tenant, session = await _the_context(request, context_id)
    await services(request)[0].restart(tenant, session.id)


@router.delete("/contexts/{context_id}")
async def remove_context(context_id: str, request: Request) -> None:
    await _the_context(request, context_id)
    raise unsupported("removing the sandbox's only context", "kill the sandbox instead")


@router.get("/health")
async def health(request: Request) -> Response:
    """Both ports' health check: the sandbox exists, the token opens it and the SDK has not
    paused it (E2B's proxy answers a paused sandbox as one not found, which ``is_running()``
    reads as False)."""
    gateway, sandboxes = services(request)
    _, session = await find_sandbox(request.headers, gateway, sandboxes, INTERPRETER_PORT,
                                    ENVD_PORT)
    if sandboxes.held(session):
        raise E2BError(502, f"The sandbox {session.id} was not found running: it is paused; "
                            "Sandbox.connect resumes it")
    if request.headers.get("e2b-sandbox-port") == str(ENVD_PORT):
        return Response(status_code=204)
    return Response(json.dumps("OK"), media_type="application/json")
