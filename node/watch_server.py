"""A node's side of ``SessionPort.watch_dir``: a watch's events as a stream of frames.

``GET /sessions/{id}/watch`` answers once the watch is in place (an error, before: the
refusal as any request's), then one ``watched`` frame per event, ``sync`` markers included,
the ``end`` event last. The gateway closing the stream stops the watch.
``POST /sessions/{id}/watches/{watch_id}/sync`` asks the watcher for a marker (a poller's
flush, ``DirWatch.flush`` on the gateway's side).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from kernel_pool import KernelPool, Session
from node.wire import PREFIX, Frame

router = APIRouter(prefix=PREFIX)


def _session(request: Request, session_id: str) -> Session:
    pool: KernelPool = request.app.state.pool
    return pool.get_session(session_id)


@router.get("/sessions/{session_id}/watch")
async def watch(request: Request, session_id: str, path: str = "", recursive: bool = False,
                watch_id: str | None = None) -> StreamingResponse:
    watched = await _session(request, session_id).watch_dir(path, recursive,
                                                             watch_id=watch_id)
    watched.markers = True

    async def lines() -> AsyncIterator[bytes]:
        try:
            async for event in watched:
                yield Frame(watched=event).model_dump_json(
                    include={"watched"}, exclude_none=True).encode() + b"\n"
        finally:
            await watched.close("the gateway stopped watching")

    return StreamingResponse(lines(), media_type="application/x-ndjson")


@router.post("/sessions/{session_id}/watches/{watch_id}/sync", status_code=204)
async def sync(request: Request, session_id: str, watch_id: str) -> None:
    found = _session(request, session_id).watches.get(watch_id)
    if found is not None:
        await found.ask_sync()
