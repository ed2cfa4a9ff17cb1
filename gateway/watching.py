"""Watching a session's folder: the use case behind the watch WebSocket.

A tenant's session is found as for any request, and its port asked for the watch (a paused
session is resumed first, by the session itself). The watch's events are the port's
(:class:`kernel_pool.WatchEvent`); the socket's frames are made from them here.
"""

from __future__ import annotations

from gateway.service import Gateway
from gateway.wire import WatchEndFrame, WatchFrame
from kernel_pool import DirWatch, WatchEvent


async def watch_folder(gateway: Gateway, tenant: str, session_id: str, path: str,
                       recursive: bool) -> DirWatch:
    """A watch of ``path`` (workspace-relative; ``""`` or ``/``: all of it) in the tenant's
    session; its refusals are the port's (no such session or folder, a file, a path outside
    the workspace, too many watches)."""
    session = await gateway.session(tenant, session_id)
    return await session.watch_dir("" if path in ("/", ".") else path, recursive)


def frame_of(event: WatchEvent) -> WatchFrame | WatchEndFrame:
    """The socket's frame for a watch event."""
    if event.type == "end":
        return WatchEndFrame(reason=event.reason or "the watch ended")
    assert event.type != "sync"  # a node's marker: never yielded by a watch
    return WatchFrame(type=event.type, path=event.path, is_dir=event.is_dir)
