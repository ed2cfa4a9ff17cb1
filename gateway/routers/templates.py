"""Custom templates: ``/v1/templates`` (docs/templates.md).

``POST /v1/templates`` takes a multipart form (``name``, ``dockerfile`` as text or a file,
``context`` a tar file, ``skip_cache``, ``step_timeout_s``) or JSON (:class:`TemplateCreate`,
the context in base64) and answers 202 at once with the template, ``building``. Its log:
``GET /v1/templates/{id}/logs?offset=`` (the lines so far) or the WebSocket
``/v1/templates/{id}/logs/ws?offset=`` (each line as a JSON frame as it comes, then
``{"type": "end", "status", "error"}``, then a 1000 close). Operators (admin keys) publish a
template to every tenant and purge the build cache.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response, WebSocket, status
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from gateway.deps import GatewayDep, TenantDep
from gateway.errors import DOMAIN_ERRORS, InvalidInput, close_code_for, detail_for
from gateway.routers.nodes import AdminDep
from gateway.routers.ws import accept_authenticated
from gateway.templates import BuildSpec, Templates
from gateway.wire import LogLine, TemplateCreate, TemplateInfo, TemplatePublish

router = APIRouter(tags=["templates"])
REASON_BYTES = 120


async def get_templates(request: Request) -> Templates:
    templates: Templates = request.app.state.templates
    return templates


TemplatesDep = Annotated[Templates, Depends(get_templates)]


async def _read(value: Any, what: str, most: int) -> bytes:
    data = await value.read(most + 1) if isinstance(value, UploadFile) else str(value).encode()
    if len(data) > most:
        raise InvalidInput(f"{what} is over {most} bytes (REPLGATE_MAX_UPLOAD_BYTES)")
    return bytes(data)


async def _spec(request: Request, most: int) -> BuildSpec:
    """The build a request asks for, as a form or as JSON; InvalidInput names what is wrong."""
    try:
        kind = request.headers.get("content-type", "")
        if kind.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
            async with request.form(max_files=2, max_fields=16, max_part_size=most) as form:
                if "dockerfile" not in form or "name" not in form:
                    raise InvalidInput("the form needs 'name' and 'dockerfile' (and may have "
                                       "'context', a tar)")
                context = form.get("context")
                timeout = form.get("step_timeout_s")
                return BuildSpec(
                    name=str(form["name"]),
                    dockerfile=(await _read(form["dockerfile"], "dockerfile", most)).decode(),
                    context=await _read(context, "context", most) if context else None,
                    skip_cache=str(form.get("skip_cache", "false")).lower() in ("1", "true"),
                    step_timeout_s=float(str(timeout)) if timeout else None,
                    start_cmd=str(form["start_cmd"]) if form.get("start_cmd") else None,
                    ready_cmd=str(form["ready_cmd"]) if form.get("ready_cmd") else None)
        body = TemplateCreate.model_validate_json(await request.body())
        context_bytes = base64.b64decode(body.context, validate=True) if body.context else None
        return BuildSpec(name=body.name, dockerfile=body.dockerfile, context=context_bytes,
                         skip_cache=body.skip_cache, step_timeout_s=body.step_timeout_s,
                         start_cmd=body.start_cmd, ready_cmd=body.ready_cmd)
    except ValidationError as exc:
        raise InvalidInput("; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" if e["loc"] else e["msg"]
            for e in exc.errors())) from exc
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise InvalidInput(f"unreadable request: {exc}") from exc


@router.post("/v1/templates", status_code=status.HTTP_202_ACCEPTED)
async def create_template(request: Request, tenant: TenantDep, gateway: GatewayDep,
                          templates: TemplatesDep) -> TemplateInfo:
    """Build a template (a rebuild when the tenant has one of that name); answers at once."""
    return await templates.start(tenant, await _spec(request, gateway.settings.max_upload_bytes))


@router.get("/v1/templates")
async def list_templates(tenant: TenantDep, templates: TemplatesDep) -> list[TemplateInfo]:
    """The tenant's templates and the published ones, newest first."""
    return await templates.list(tenant)


@router.post("/v1/templates/cache/purge")
async def purge_cache(_: AdminDep, templates: TemplatesDep,
                      tenant: str | None = None) -> dict[str, list[str]]:
    """An operator's: the templates' earlier builds' images removed, each next build uncached."""
    return {"removed": await templates.purge_cache(tenant)}


@router.get("/v1/templates/{template_id}")
async def get_template(template_id: str, tenant: TenantDep,
                       templates: TemplatesDep) -> TemplateInfo:
    return await templates.get(tenant, template_id)


@router.get("/v1/templates/{template_id}/logs")
async def template_logs(template_id: str, tenant: TenantDep, templates: TemplatesDep,
                        offset: Annotated[int, Query(ge=0)] = 0,
                        build_id: str | None = None) -> list[LogLine]:
    """A build's log lines from ``offset`` (default: the latest build's)."""
    return await templates.logs(tenant, template_id, offset=offset, build_id=build_id)


@router.delete("/v1/templates/{template_id}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_template(template_id: str, tenant: TenantDep,
                          templates: TemplatesDep) -> Response:
    await templates.delete(tenant, template_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/v1/templates/{template_id}/publish")
async def publish_template(template_id: str, body: TemplatePublish, _: AdminDep,
                           templates: TemplatesDep) -> TemplateInfo:
    """An operator's: every tenant may start sessions of it (``public``), or its own alone."""
    return await templates.publish(template_id, body.public)


@router.websocket("/v1/templates/{template_id}/logs/ws")
async def follow_logs(websocket: WebSocket, template_id: str, offset: int = 0) -> None:
    accepted = await accept_authenticated(websocket)
    if accepted is None:
        return
    templates: Templates = websocket.app.state.templates
    _, tenant = accepted
    try:
        async for line in templates.follow(tenant, template_id, offset=max(offset, 0)):
            await websocket.send_text(line.model_dump_json())
        info = await templates.get(tenant, template_id)
    except DOMAIN_ERRORS as exc:
        reason = detail_for(exc).encode()[:REASON_BYTES].decode(errors="ignore")
        await websocket.close(code=close_code_for(exc), reason=reason)
        return
    with contextlib.suppress(RuntimeError):  # the client went first
        await websocket.send_json({"type": "end", "status": info.status.value,
                                   "error": info.error})
        await websocket.close(code=1000)
