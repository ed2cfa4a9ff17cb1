"""The port's routes for a session's workspace files (the host's side of ``/home/user``).

- ``GET``/``PUT /port/v1/sessions/{id}/file``: a file's bytes (a ``limit`` on reads), written
  with its ``metadata`` (a JSON object of strings)
- ``GET /port/v1/sessions/{id}/files``: every file
- ``GET``/``DELETE /port/v1/sessions/{id}/entry``, ``GET``/``POST .../dir``, ``POST .../move``:
  an entry, a folder's entries (``depth``), a new folder, a move

The sandbox's own files beyond the workspace are :mod:`node.sandbox_fs`'s.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import Response
from pydantic import TypeAdapter

from kernel_pool import Entry, FileInfo, KernelPool, Session
from node.wire import PREFIX, Made, Move, Written

router = APIRouter(prefix=PREFIX)

_METADATA = TypeAdapter(dict[str, str])


def _session(request: Request, session_id: str) -> Session:
    pool: KernelPool = request.app.state.pool
    return pool.get_session(session_id)


@router.get("/sessions/{session_id}/file")
async def read_file(request: Request, session_id: str, path: str,
                    limit: Annotated[int, Query(ge=0)]) -> Response:
    data = await _session(request, session_id).read_file(path, limit)
    return Response(data, media_type="application/octet-stream")


@router.put("/sessions/{session_id}/file")
async def write_file(request: Request, session_id: str, path: str,
                     data: Annotated[bytes, Body(media_type="application/octet-stream")] = b"",
                     metadata: str | None = None) -> Written:
    """``metadata``: the file's metadata as a JSON object of strings."""
    pairs = _METADATA.validate_json(metadata) if metadata else None
    return Written(size=await _session(request, session_id).write_file(path, data, pairs))


@router.get("/sessions/{session_id}/files")
async def list_files(request: Request, session_id: str) -> list[FileInfo]:
    return await _session(request, session_id).list_files()


@router.get("/sessions/{session_id}/entry")
async def stat_path(request: Request, session_id: str, path: str) -> Entry:
    return await _session(request, session_id).stat_path(path)


@router.delete("/sessions/{session_id}/entry", status_code=204)
async def remove_path(request: Request, session_id: str, path: str) -> None:
    await _session(request, session_id).remove_path(path)


@router.get("/sessions/{session_id}/dir")
async def list_dir(request: Request, session_id: str, path: str,
                   depth: Annotated[int, Query(ge=1)] = 1) -> list[Entry]:
    return await _session(request, session_id).list_dir(path, depth)


@router.post("/sessions/{session_id}/dir")
async def make_dir(request: Request, session_id: str, path: str) -> Made:
    return Made(made=await _session(request, session_id).make_dir(path))


@router.post("/sessions/{session_id}/move")
async def move_path(request: Request, session_id: str, body: Move) -> Entry:
    return await _session(request, session_id).move_path(body.source, body.destination)
