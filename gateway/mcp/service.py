"""The MCP server on the gateway: ``/mcp``, its sessions on the in-process service.

Server side only (it imports the gateway's service); ``replgate mcp`` over stdio does not need
it. Sessions run through :class:`Gateway` directly, with no HTTP loopback. The service's errors
are translated where they enter into the client's error tree, with the status the HTTP API
would have answered, so the tools treat both backends alike.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from common.settings import Settings
from gateway.client import CommandResult, Execution, FileInfo, ReplgateError, ToolLimits
from gateway.client._errors import error_for_status
from gateway.errors import DOMAIN_ERRORS, detail_for, status_for
from gateway.network import network_of
from gateway.service import Gateway
from gateway.wire import CommandRequest, ForkRequest, SessionCreate
from kernel_pool import KernelPoolError, NetworkPolicy, SessionClosed, SessionNotFound

from ._http import McpEndpoint
from ._sessions import Backend, BackendFactory

__all__ = ["McpEndpoint", "ServiceBackend", "mcp_endpoint"]

T = TypeVar("T")


@asynccontextmanager
async def _translated() -> AsyncIterator[None]:
    try:
        yield
    except DOMAIN_ERRORS as exc:
        raise error_for_status(status_for(exc), detail_for(exc)) from exc


class ServiceBackend:
    """One tenant's session, driven through :class:`Gateway` directly."""

    def __init__(self, gateway: Gateway, tenant: str, session_id: str) -> None:
        self._gateway = gateway
        self._tenant = tenant
        self.session_id = session_id

    @classmethod
    def factory(cls, gateway: Gateway, tenant: str, profile: str = "default") -> BackendFactory:
        """Make each session as ``POST /v1/sessions`` would, for ``tenant``, of ``profile``
        (a custom template's too)."""

        async def create() -> Backend:
            async with _translated():
                session = await gateway.create_session(
                    tenant, SessionCreate(profile=profile, metadata={"client": "mcp"}))
            return cls(gateway, tenant, session.id)

        return create

    async def _call(self, operation: Callable[[], Awaitable[T]]) -> T:
        async with _translated():
            return await operation()

    async def execute(self, code: str, timeout_s: float | None,
                      language: str | None = None) -> Execution:
        async def run() -> Execution:
            session = await self._gateway.session(self._tenant, self.session_id)
            return await self._gateway.execute(self._tenant, session, code, timeout_s,
                                               language=language)

        return await self._call(run)

    async def write_file(self, path: str, data: bytes) -> int:
        return await self._call(
            lambda: self._gateway.write_file(self._tenant, self.session_id, path, data))

    async def read_file(self, path: str) -> bytes:
        return await self._call(
            lambda: self._gateway.read_file(self._tenant, self.session_id, path))

    async def list_files(self) -> list[FileInfo]:
        return await self._call(lambda: self._gateway.list_files(self._tenant, self.session_id))

    async def restart(self) -> None:
        await self._call(lambda: self._gateway.restart(self._tenant, self.session_id))

    async def notebook(self) -> dict[str, Any]:
        return await self._call(lambda: self._gateway.notebook(self._tenant, self.session_id))

    async def run_command(self, cmd: str, timeout_s: float | None) -> CommandResult:
        async def run() -> CommandResult:
            session = await self._gateway.session(self._tenant, self.session_id)
            return await self._gateway.run_command(
                self._tenant, session, CommandRequest(cmd=cmd, timeout_s=timeout_s))

        return await self._call(run)

    async def network(self) -> NetworkPolicy:
        async def read() -> NetworkPolicy:
            return network_of(await self._gateway.session(self._tenant, self.session_id))

        return await self._call(read)

    async def fork(self, count: int) -> list[str]:
        children = await self._call(lambda: self._gateway.fork(
            self._tenant, self.session_id, ForkRequest(count=count, metadata={"client": "mcp"})))
        return [child.id for child in children]

    async def exists(self) -> bool:
        try:
            await self._gateway.session(self._tenant, self.session_id)
        except KernelPoolError:
            return False
        return True

    async def close(self) -> None:
        try:
            await self._gateway.delete_session(self._tenant, self.session_id)
        except (SessionNotFound, SessionClosed):
            pass  # already gone, which is what closing asks for
        except DOMAIN_ERRORS as exc:
            raise ReplgateError(f"could not delete session {self.session_id}: {exc}") from exc

    def __repr__(self) -> str:
        return f"<ServiceBackend {self.session_id} tenant={self._tenant}>"


def mcp_endpoint(settings: Settings) -> McpEndpoint:
    """The ``/mcp`` endpoint for a gateway configured by ``settings``; serve it inside
    ``endpoint.run()`` in the app's lifespan."""
    limits = ToolLimits(default_timeout_s=settings.limits.default_timeout_s,
                        max_timeout_s=settings.limits.max_timeout_s,
                        output_chars=settings.limits.caps.stream_chars)
    return McpEndpoint(ServiceBackend.factory, limits=limits, idle_ttl_s=settings.pool.idle_ttl_s)
