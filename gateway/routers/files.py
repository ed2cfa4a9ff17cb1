"""Workspace files: ``/v1/sessions/{id}/files``."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, status

from gateway.deps import GatewayDep, TenantDep
from gateway.service import upload_too_large
from gateway.wire import FileInfo, FileWritten

router = APIRouter(prefix="/v1/sessions/{session_id}/files", tags=["files"])


@router.get("")
async def list_files(session_id: str, tenant: TenantDep, gateway: GatewayDep) -> list[FileInfo]:
    """Every file in the workspace, recursively, with paths relative to it."""
    return await gateway.list_files(tenant, session_id)


@router.put("/{path:path}", status_code=status.HTTP_201_CREATED)
async def upload(session_id: str, path: str, request: Request, tenant: TenantDep,
                 gateway: GatewayDep) -> FileWritten:
    """Write the raw request body to ``path`` (parent folders are created)."""
    await gateway.session(tenant, session_id)
    data = await read_upload(request, gateway.settings.max_upload_bytes)
    written = await gateway.write_file(tenant, session_id, path, data)
    return FileWritten(path=path, size=written)


async def read_upload(request: Request, limit: int) -> bytes:
    """The request's body, refused (413) as soon as it is known to be over ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise upload_too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise upload_too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


@router.get("/{path:path}")
async def download(session_id: str, path: str, tenant: TenantDep,
                   gateway: GatewayDep) -> Response:
    return Response(await gateway.read_file(tenant, session_id, path),
                    media_type="application/octet-stream")
