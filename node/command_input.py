"""The port's routes for a running command's input, and the gateway's calls to them.

- ``POST /port/v1/sessions/{id}/commands/{command}/input``: bytes for its stdin (or terminal)
- ``POST /port/v1/sessions/{id}/commands/{command}/close-input``: its stdin ends
- ``POST /port/v1/sessions/{id}/commands/{command}/resize``: its terminal's new size

The command itself runs in the stream of ``POST .../commands`` (:mod:`node.server`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from kernel_pool import KernelPool, PtySize
from node.wire import PREFIX

router = APIRouter(prefix=PREFIX)

MAX_INPUT_BYTES = 1 << 20
"""One write's bytes at most (the gateway sends input in pieces well under it)."""


def _pool(request: Request) -> KernelPool:
    pool: KernelPool = request.app.state.pool
    return pool


@router.post("/sessions/{session_id}/commands/{command_id}/input", status_code=204)
async def send_input(request: Request, session_id: str, command_id: str) -> Response:
    data = await request.body()
    session = _pool(request).get_session(session_id)
    await session.send_command_input(command_id, data[:MAX_INPUT_BYTES])
    return Response(status_code=204)


@router.post("/sessions/{session_id}/commands/{command_id}/close-input", status_code=204)
async def close_input(request: Request, session_id: str, command_id: str) -> Response:
    await _pool(request).get_session(session_id).close_command_input(command_id)
    return Response(status_code=204)


@router.post("/sessions/{session_id}/commands/{command_id}/resize", status_code=204)
async def resize(request: Request, session_id: str, command_id: str,
                 size: PtySize) -> Response:
    await _pool(request).get_session(session_id).resize_command(command_id, size)
    return Response(status_code=204)
