"""A remote session's folder watch: the node's stream of a watch (``node.watch_server``) read
into a :class:`~kernel_pool.DirWatch` on the gateway's side.

The stream's ``sync`` markers answer this side's flushes (asked for by a request of their
own); its ``end`` event ends the watch. A stream that stops without one (the node went, or
stopped answering) ends the watch too, saying so: a watch never ends with an error.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlencode

from kernel_pool import DirWatch, KernelPoolError
from node.client import NodeClient
from node.wire import error_from


class RemoteWatch(DirWatch):
    """A watch of a session on a node."""

    def __init__(self, client: NodeClient, session_id: str, path: str, recursive: bool,
                 watch_id: str | None = None) -> None:
        super().__init__(path, recursive, watch_id=watch_id)
        self._client = client
        self._session_id = session_id
        self._pump: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Open the node's stream; once it answers, the watch is in place there (its refusal
        is raised here as the node raised it)."""
        query = urlencode({"path": self.path, "recursive": str(self.recursive).lower(),
                           "watch_id": self.id})
        opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pump = asyncio.create_task(self._read(f"/sessions/{self._session_id}/watch?"
                                                    f"{query}", opened),
                                         name=f"replgate-{self.id}")
        try:
            await opened
        except BaseException:
            self._pump.cancel()
            raise

    async def _read(self, path: str, opened: asyncio.Future[None]) -> None:
        try:
            async with self._client.stream(path, None, self._session_id) as frames:
                opened.set_result(None)
                async for frame in frames:
                    if frame.error is not None:
                        self.end(f"the node ended the watch: {error_from(frame.error)}")
                    elif frame.watched is not None:
                        self.put(frame.watched)
        except (KernelPoolError, ValueError) as exc:  # ValueError: a garbled frame
            if not opened.done():
                opened.set_exception(exc)
                return
            self.end(f"its node {self._client.node_id} stopped answering: {exc}")
            return
        self.end(f"its node {self._client.node_id} ended the stream")

    async def ask_sync(self) -> None:
        with contextlib.suppress(KernelPoolError):
            await self._client.call(
                "POST", f"/sessions/{self._session_id}/watches/{self.id}/sync",
                session_id=self._session_id)

    def _stop(self) -> None:
        if self._pump is not None and self._pump is not asyncio.current_task():
            self._pump.cancel()

    async def _release(self) -> None:
        self._stop()
        if self._pump is not None and self._pump is not asyncio.current_task():
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
