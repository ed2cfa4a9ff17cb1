"""One MCP connection's replgate session: created on the first tool call, deleted at the end.

The tools run on a :class:`LazySession`, which asks its :data:`BackendFactory` for a
:class:`Backend` (a replgate session: over the gateway's HTTP API for stdio, over the in-process
service for the ``/mcp`` mount) when first needed, and deletes it on :meth:`LazySession.close`.
A session the gateway culled meanwhile (idle past ``REPLGATE_IDLE_TTL_S``) is reported once as
:class:`SessionExpired`; the next call starts a fresh one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from gateway.client import (
    AsyncSandbox,
    CommandResult,
    Execution,
    FileInfo,
    NotFoundError,
    ReplgateError,
    ToolSession,
    ToolSessionOf,
)
from kernel_pool import NetworkPolicy

T = TypeVar("T")


class Backend(ToolSession, Protocol):
    """A replgate session the tools can run on, and end."""

    async def exists(self) -> bool:
        """Whether the gateway still has this session."""
        ...

    async def close(self) -> None:
        """Delete the session (kernel and workspace); closing twice is not an error."""
        ...


BackendFactory = Callable[[], Awaitable[Backend]]


class SessionExpired(ReplgateError):
    """The connection's session is gone (culled when idle); the next call starts a new one."""


class LazySession:
    """A :class:`ToolSession` that starts its replgate session on first use."""

    def __init__(self, factory: BackendFactory) -> None:
        self._factory = factory
        self._backend: Backend | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    @property
    def started(self) -> bool:
        """Whether a replgate session exists for it now."""
        return self._backend is not None

    async def _current(self) -> Backend:
        async with self._lock:
            if self._closed:
                raise ReplgateError("This MCP connection has ended; open a new one.")
            if self._backend is None:
                self._backend = await self._factory()
            return self._backend

    async def _run(self, operation: Callable[[Backend], Awaitable[T]]) -> T:
        backend = await self._current()
        try:
            return await operation(backend)
        except NotFoundError:
            if await backend.exists():
                raise  # a missing file, not a missing session
            async with self._lock:
                if self._backend is backend:
                    self._backend = None
            raise SessionExpired(
                "The Python session of this connection expired (it was idle longer than the "
                "gateway keeps sessions) and was deleted: its variables and files are gone. "
                "Call the tool again to start a fresh session.", status_code=404) from None

    async def execute(self, code: str, timeout_s: float | None,
                      language: str | None = None) -> Execution:
        return await self._run(lambda backend: backend.execute(code, timeout_s, language))

    async def write_file(self, path: str, data: bytes) -> int:
        return await self._run(lambda backend: backend.write_file(path, data))

    async def read_file(self, path: str) -> bytes:
        return await self._run(lambda backend: backend.read_file(path))

    async def list_files(self) -> list[FileInfo]:
        return await self._run(lambda backend: backend.list_files())

    async def restart(self) -> None:
        await self._run(lambda backend: backend.restart())

    async def notebook(self) -> dict[str, Any]:
        return await self._run(lambda backend: backend.notebook())

    async def run_command(self, cmd: str, timeout_s: float | None) -> CommandResult:
        return await self._run(lambda backend: backend.run_command(cmd, timeout_s))

    async def fork(self, count: int) -> list[str]:
        return await self._run(lambda backend: backend.fork(count))

    async def network(self) -> NetworkPolicy:
        return await self._run(lambda backend: backend.network())

    async def close(self) -> None:
        """Delete the replgate session, if one was started; later calls are refused."""
        async with self._lock:
            self._closed = True
            backend, self._backend = self._backend, None
        if backend is not None:
            await backend.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "started" if self._backend else "not started"
        return f"<LazySession {state}>"


class ClientBackend(ToolSessionOf):
    """A session on a running gateway, through the Python client (for ``replgate mcp``)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        super().__init__(sandbox)
        self.sandbox = sandbox

    @classmethod
    def factory(cls, base_url: str | None, api_key: str | None) -> BackendFactory:
        """Make each session with ``AsyncSandbox.create(base_url=..., api_key=...)``."""

        async def create() -> Backend:
            sandbox = await AsyncSandbox.create(base_url=base_url, api_key=api_key,
                                                metadata={"client": "mcp"})
            return cls(sandbox)

        return create

    async def exists(self) -> bool:
        try:
            await self.sandbox.info()
        except NotFoundError:
            return False
        return True

    async def close(self) -> None:
        await self.sandbox.close()
