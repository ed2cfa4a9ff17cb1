"""E2B's code interpreter (port 49999) on a session's kernel: ``/execute`` and ``/contexts``.

``/execute`` answers a stream of JSON lines as the code runs (:mod:`gateway.e2b._stream`),
bounded on the server by the profile's maximum timeout. A sandbox's contexts are its session's
code contexts: its Python kernel (whose E2B id is the sandbox's id, as before contexts), each
language's default one (``run_code(language=...)``; its id is the language's name) and those
``create_code_context`` makes. As E2B's server does, a new sandbox lists a default context per
language its image offers: one not used yet is listed all the same (its kernel starts at its
first execution, as every context's).
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
from kernel_pool import ContextInfo, SessionPort, check_env, check_language, env_code

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


PYTHON = "python"
"""replgate's id of the session's own kernel as a context."""


def _context(session: SessionPort, context: ContextInfo) -> dict[str, str]:
    """A context as E2B's SDKs read it; the Python kernel's id is the sandbox's."""
    return {"id": session.id if context.id == PYTHON else context.id,
            "language": context.language, "cwd": context.cwd or HOME}


def _ours(session: SessionPort, context_id: str) -> str:
    """replgate's id of the context E2B names ``context_id``."""
    return PYTHON if context_id == session.id else context_id


def _default_kernels(session: SessionPort) -> list[str]:
    """The id of each default context the session's image offers, in its order (a default
    context's id is its kernel's language: TypeScript's is JavaScript's)."""
    offered = session.languages
    return list(dict.fromkeys([PYTHON, *(check_language(name, offered) for name in offered)]))


async def _listed(session: SessionPort) -> list[ContextInfo]:
    """The contexts E2B lists: the Python kernel, every language's default one (made or
    not), then the created ones in their order (the SDK's users read the last as the newest)."""
    made = await session.list_contexts()
    by_id = {context.id: context for context in made}
    defaults = [by_id.get(kernel) or ContextInfo(id=kernel, language=kernel)
                for kernel in _default_kernels(session)]
    return defaults + [context for context in made if context.id not in {
        default.id for default in defaults}]


async def _known(session: SessionPort, context_id: str) -> bool:
    return context_id in {c.id for c in await _listed(session)}


def _language(language: str | None) -> str | None:
    """E2B's language name as replgate's (its template's kernel name ``python3`` is python)."""
    return PYTHON if language and language.strip().lower() == "python3" else language


async def _env_code(session: SessionPort, env: dict[str, str], language: str | None,
                    context_id: str | None) -> tuple[str, str] | None:
    """Code that sets ``env`` for one call in the kernel that runs it, and code that puts the
    values from before back (E2B's ``envs`` on ``run_code``); None for no variables."""
    if not env:
        return None
    if context_id is None:
        kernel = check_language(language, session.languages)
    else:
        kernel = next(c.language for c in await session.list_contexts() if c.id == context_id)
    code = env_code(kernel, check_env(env))
    if code is None:
        raise unsupported(f"envs in a {kernel} context", "set the variables in the code itself")
    return code


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
    language = _language(body.language)
    context_id = _ours(session, body.context_id) if body.context_id else None
    if context_id is not None:
        if not await _known(session, context_id):
            raise E2BError(404, f"Context {body.context_id} not found")
        if context_id != PYTHON and context_id in _default_kernels(session):
            # A default context runs by its language (which makes it at its first use).
            context_id, language = None, context_id
    timeout = session.profile.max_timeout_s
    env = {k: v for k, v in (body.env_vars or {}).items() if k}
    code = await _env_code(session, env, language, context_id)
    if code is not None:  # run in the same context, just before and after the call
        gateway.submit(tenant, session, code[0], timeout, language=language,
                       context_id=context_id)
    handle = gateway.submit(tenant, session, body.code, timeout, language=language,
                            context_id=context_id)
    if code is not None:
        gateway.submit(tenant, session, code[1], timeout, language=language,
                       context_id=context_id)
    return ExecutionStream(session, handle)


@router.get("/contexts")
async def list_contexts(request: Request) -> list[dict[str, str]]:
    gateway, sandboxes = services(request)
    _, session = await find_sandbox(request.headers, gateway, sandboxes, INTERPRETER_PORT)
    return [_context(session, context) for context in await _listed(session)]


@router.post("/contexts")
async def create_context(body: CreateContext, request: Request) -> dict[str, Any]:
    """Another kernel of ``language`` in the sandbox, with its own variables (started at its
    first execution, in the folder ``cwd``: the sandbox's home if none is named)."""
    gateway, sandboxes = services(request)
    _, session = await find_sandbox(request.headers, gateway, sandboxes, INTERPRETER_PORT)
    cwd = None if body.cwd in (None, "", HOME) else body.cwd
    return _context(session, await session.create_context(_language(body.language), cwd))


async def _the_context(request: Request, context_id: str) -> tuple[str, SessionPort, str, bool]:
    """The sandbox with context ``context_id``, replgate's id of it (404 for none) and
    whether it was made yet (a default context is listed before its first use)."""
    gateway, sandboxes = services(request)
    tenant, session = await find_sandbox(request.headers, gateway, sandboxes, INTERPRETER_PORT)
    ours = _ours(session, context_id)
    if not await _known(session, ours):
        raise E2BError(404, f"Context {context_id} not found")
    made = ours == PYTHON or ours in {c.id for c in await session.list_contexts()}
    return tenant, session, ours, made


@router.post("/contexts/{context_id}/restart")
async def restart_context(context_id: str, request: Request) -> None:
    """Restart the context's kernel: its variables gone, files (and other contexts) kept."""
    tenant, session, ours, made = await _the_context(request, context_id)
    if ours == PYTHON:
        await services(request)[0].restart(tenant, session.id)
    elif made:  # one not made yet has no variables to lose
        await session.restart_context(ours)


@router.delete("/contexts/{context_id}")
async def remove_context(context_id: str, request: Request) -> None:
    """End a context's kernel and forget it; a language's default context is listed again
    (its next use starts a fresh kernel), as E2B's server makes it again on its next use."""
    _, session, ours, made = await _the_context(request, context_id)
    if ours == PYTHON:
        raise unsupported("removing the sandbox's Python context (its own kernel)",
                          "kill the sandbox instead")
    if made:
        await session.remove_context(ours)


@router.get("/health")
async def health(request: Request) -> Response:
    """Both ports' health check: the sandbox exists, the token opens it and the SDK has not
    paused it (E2B's proxy answers a paused sandbox as one not found, which ``is_running()``
    reads as False)."""
    gateway, sandboxes = services(request)
    _, session = await find_sandbox(request.headers, gateway, sandboxes, INTERPRETER_PORT,
                                    ENVD_PORT)
    if await sandboxes.held(session):
        raise E2BError(502, f"The sandbox {session.id} was not found running: it is paused; "
                            "Sandbox.connect resumes it")
    if request.headers.get("e2b-sandbox-port") == str(ENVD_PORT):
        return Response(status_code=204)
    return Response(json.dumps("OK"), media_type="application/json")
