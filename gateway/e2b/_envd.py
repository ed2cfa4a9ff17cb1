"""envd's HTTP API (port 49983): ``/files`` (download, upload) on the session's workspace.

Uploads come as ``multipart/form-data`` (one part per file, the file's path in the part's
filename unless ``?path=`` names the only one) or as a raw ``application/octet-stream`` body
(envd 0.5.7 and later), gzipped or not (``Content-Encoding: gzip``, the size limit applying to
the inflated file). ``X-Metadata-<key>: <value>`` headers (envd 0.6.2) become every uploaded
file's metadata, replacing what it had. Both answer ``[{"name", "type": "file", "path"}]``,
with ``"metadata"`` when some was set. A download is gzipped when ``Accept-Encoding`` asks.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from starlette.datastructures import UploadFile
from starlette.types import Message

from gateway.e2b import _sandbox_paths as sandbox
from gateway.e2b._access import ENVD_PORT, find_sandbox, services
from gateway.e2b._errors import E2BError, E2BRoute
from gateway.e2b._paths import to_e2b, to_workspace
from gateway.file_bodies import file_response, read_upload

METADATA_HEADER = "x-metadata-"

router = APIRouter(prefix="/e2b/sandbox", tags=["e2b"], route_class=E2BRoute,
                   include_in_schema=False)


@router.get("/files")
async def download(request: Request, path: str = "") -> Response:
    gateway, sandboxes = services(request)
    tenant, session = await find_sandbox(request.headers, gateway, sandboxes, ENVD_PORT)
    if not path:
        raise E2BError(400, "the query parameter path is required")
    if sandbox.in_sandbox(path):  # beyond the workspace: through the container, streamed
        return await sandbox.download(session, path, gateway.settings.max_download_bytes)
    data = await gateway.read_file(tenant, session.id, to_workspace(path))
    return await file_response(request, data)


@router.post("/files")
async def upload(request: Request, path: str = "") -> list[dict[str, Any]]:
    gateway, sandboxes = services(request)
    _tenant, session = await find_sandbox(request.headers, gateway, sandboxes, ENVD_PORT)
    multipart = request.headers.get("content-type", "").startswith("multipart/form-data")
    if sandbox.in_sandbox(path) and not multipart:  # beyond the workspace: streamed in
        return await sandbox.upload(request, session, path, gateway.settings.max_upload_bytes)
    # Header names come lowercased, as envd lowercases metadata keys.
    metadata = {name.removeprefix(METADATA_HEADER): value
                for name, value in request.headers.items()
                if name.startswith(METADATA_HEADER)} or None
    body = await read_upload(request, gateway.settings.max_upload_bytes)
    files: list[tuple[str, bytes]] = []
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        # Parsed from the body read under the limit, so a chunked upload cannot spool
        # more than the limit to the gateway's disk first.
        async def replay() -> Message:
            return {"type": "http.request", "body": body, "more_body": False}

        async with Request(request.scope, replay).form(max_files=1000) as form:
            parts = [part for _, part in form.multi_items() if isinstance(part, UploadFile)]
            for part in parts:
                name = path if path and len(parts) == 1 else (part.filename or "")
                files.append((name, await part.read()))
    else:
        files.append((path, body))
    written = []
    for name, data in files:
        if not name:
            raise E2BError(400, "a file without a path: name it with ?path= or in the part's "
                                "filename")
        if sandbox.in_sandbox(name):
            written.append(await sandbox.upload_part(session, name, data))
            continue
        relative = to_workspace(name)
        # The body was read under the upload limit already: straight to the session.
        await session.write_file(relative, data, metadata)
        written.append({"name": relative.rsplit("/", 1)[-1], "type": "file",
                        "path": to_e2b(relative), **({"metadata": metadata} if metadata else {})})
    return written

