"""Workspace files: ``/v1/sessions/{id}/files``."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, status

from gateway.deps import GatewayDep, TenantDep
from gateway.file_bodies import file_response, read_upload
from gateway.wire import FileInfo, FileWritten

router = APIRouter(prefix="/v1/sessions/{session_id}/files", tags=["files"])


@router.get("")
async def list_files(session_id: str, tenant: TenantDep, gateway: GatewayDep) -> list[FileInfo]:
    """Every file in the workspace, recursively, with paths relative to it."""
    return await gateway.list_files(tenant, session_id)


@router.put("/{path:path}", status_code=status.HTTP_201_CREATED)
async def upload(session_id: str, path: str, request: Request, tenant: TenantDep,
                 gateway: GatewayDep) -> FileWritten:
    """Write the raw request body to ``path`` (parent folders are created); a body sent with
    ``Content-Encoding: gzip`` is inflated, the size limit applying to the file."""
    await gateway.session(tenant, session_id)
    data = await read_upload(request, gateway.settings.max_upload_bytes)
    written = await gateway.write_file(tenant, session_id, path, data)
    return FileWritten(path=path, size=written)


@router.get("/{path:path}")
async def download(session_id: str, path: str, request: Request, tenant: TenantDep,
                   gateway: GatewayDep) -> Response:
    """The file's bytes, gzipped when the request's ``Accept-Encoding`` takes gzip."""
    return await file_response(request, await gateway.read_file(tenant, session_id, path))
