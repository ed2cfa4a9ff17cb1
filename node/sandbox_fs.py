"""The port's routes for a session's own file system beyond its workspace
(:mod:`kernel_pool._sandbox_fs`), and a remote session's calls to them.

- ``POST /port/v1/sessions/{id}/sandbox-fs``: one :class:`~kernel_pool.SandboxFsRequest`,
  its :class:`~kernel_pool.SandboxFsAnswer`
- ``GET /port/v1/sessions/{id}/sandbox-file?path=&limit=``: the file's bytes, streamed (its
  refusal answered as an error before any)
- ``PUT /port/v1/sessions/{id}/sandbox-file?path=``: the body, streamed into the file; its
  :class:`~kernel_pool.SandboxEntry`
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from common.streams import primed
from kernel_pool import (
    KernelPool,
    SandboxEntry,
    SandboxFsAnswer,
    SandboxFsRequest,
    SessionClosed,
)
from node.client import NodeClient
from node.wire import PREFIX

router = APIRouter(prefix=PREFIX)


def _pool(request: Request) -> KernelPool:
    pool: KernelPool = request.app.state.pool
    return pool


@router.post("/sessions/{session_id}/sandbox-fs")
async def sandbox_fs(request: Request, session_id: str,
                     operation: SandboxFsRequest) -> SandboxFsAnswer:
    return await _pool(request).get_session(session_id).sandbox_fs(operation)


@router.get("/sessions/{session_id}/sandbox-file")
async def sandbox_read(request: Request, session_id: str, path: str,
                       limit: int) -> StreamingResponse:
    # (its refusal, before the first piece, answered as the node's errors are)
    body = await primed(_pool(request).get_session(session_id).sandbox_read(path, limit))
    return StreamingResponse(body, media_type="application/octet-stream")


@router.put("/sessions/{session_id}/sandbox-file")
async def sandbox_write(request: Request, session_id: str, path: str) -> SandboxEntry:
    return await _pool(request).get_session(session_id).sandbox_write(path, request.stream())


class RemoteSandboxFs:
    """The part of :class:`~node.remote.RemoteSession` that reaches its sandbox's own files."""

    id: str
    client: NodeClient
    _closed: bool

    async def sandbox_fs(self, request: SandboxFsRequest) -> SandboxFsAnswer:
        if self._closed:
            raise SessionClosed(self.id)
        answer: SandboxFsAnswer = await self.client.call(
            "POST", f"/sessions/{self.id}/sandbox-fs", SandboxFsAnswer, session_id=self.id,
            content=request.model_dump_json(), headers={"content-type": "application/json"})
        return answer

    async def sandbox_read(self, path: str, limit: int) -> AsyncGenerator[bytes, None]:
        if self._closed:
            raise SessionClosed(self.id)
        async with self.client.byte_stream(
                "GET", f"/sessions/{self.id}/sandbox-file", session_id=self.id,
                params={"path": path, "limit": limit}) as chunks:
            yield b""  # the node answered: no refusal
            async for chunk in chunks:
                yield chunk

    async def sandbox_write(self, path: str, chunks: AsyncIterable[bytes]) -> SandboxEntry:
        if self._closed:
            raise SessionClosed(self.id)
        entry: SandboxEntry = await self.client.call(
            "PUT", f"/sessions/{self.id}/sandbox-file", SandboxEntry, session_id=self.id,
            params={"path": path}, content=chunks,
            headers={"content-type": "application/octet-stream"})
        return entry
