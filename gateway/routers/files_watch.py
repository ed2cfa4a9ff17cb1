"""The folder watch WebSocket: ``/v1/sessions/{id}/files/watch?path=&recursive=``.

Authenticated as the session WebSocket (a key in ``Authorization``, or ``?token=`` for
browsers). Once the watch is in place the server sends ``{"type": "ready"}`` (a change made
after it is seen), then one frame per change, in order,
``{"type": "create"|"write"|"remove"|"rename"|"chmod", "path", "is_dir"}`` (the path relative
to the workspace), and a last ``{"type": "end", "reason"}`` when the session pauses or ends,
the folder goes, or the client fell too far behind; then it closes (1000). A refused watch
closes at once with the error's code (4404: no such session or folder, 4400: not a folder or
outside the workspace, 4429: too many watches) and its detail as the reason. Clients send
nothing; closing the socket stops the watch.
"""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from gateway.errors import DOMAIN_ERRORS, close_code_for, detail_for
from gateway.routers.ws import accept_authenticated
from gateway.watching import frame_of, watch_folder
from gateway.wire import WatchReadyFrame
from kernel_pool import DirWatch

router = APIRouter()
REASON_BYTES = 120
"""A close frame's reason is at most 123 bytes."""


@router.websocket("/v1/sessions/{session_id}/files/watch")
async def files_watch(websocket: WebSocket, session_id: str, path: str = "",
                      recursive: bool = True) -> None:
    accepted = await accept_authenticated(websocket)
    if accepted is None:
        return
    gateway, tenant = accepted
    try:
        watch = await watch_folder(gateway, tenant, session_id, path, recursive)
    except DOMAIN_ERRORS as exc:
        reason = detail_for(exc).encode()[:REASON_BYTES].decode(errors="ignore")
        await websocket.close(code=close_code_for(exc), reason=reason)
        return
    sender = asyncio.create_task(_send(websocket, watch))
    try:
        while not sender.done():  # clients send nothing: this notices a close
            receiving = asyncio.ensure_future(websocket.receive())
            await asyncio.wait({receiving, sender}, return_when=asyncio.FIRST_COMPLETED)
            if not receiving.done():
                receiving.cancel()
                break
            if receiving.result()["type"] == "websocket.disconnect":
                break
    except WebSocketDisconnect:
        pass
    finally:
        await watch.close("the client closed the socket")
        sender.cancel()
        with contextlib.suppress(BaseException):
            await sender


async def _send(websocket: WebSocket, watch: DirWatch) -> None:
    await websocket.send_text(WatchReadyFrame().model_dump_json())
    async for event in watch:
        await websocket.send_text(frame_of(event).model_dump_json())
    await websocket.close(code=1000)
