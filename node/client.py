"""The gateway's connection to one node: its port's requests, and its channel.

:class:`NodeClient` speaks to one node: one kept HTTP connection pool (httpx), and the
channel's WebSocket for the hot paths. Errors come back as the node raised them
(:func:`~node.wire.error_from`); a node that does not answer is
:class:`~node.channel.NodeUnreachable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import httpx
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind
from pydantic import BaseModel, TypeAdapter

from common.tracing import setup_tracing
from kernel_pool import KernelPoolError, NodeUnreachable, SessionState
from node.channel import NodeChannel
from node.secret_answers import SecretAnswers
from node.wire import (
    PREFIX,
    CreateSession,
    ErrorOut,
    ForkSession,
    Frame,
    NodeInfo,
    Submit,
    error_from,
)

M = TypeVar("M", bound=BaseModel)
_STATES = TypeAdapter(list[SessionState])


class NodeClient:
    """Requests to one node's port; the connection is kept between them."""

    def __init__(self, node_id: str, address: str, tls: ssl.SSLContext | None, *,
                 timeout_s: float = 30.0, secrets: SecretAnswers | None = None) -> None:
        self.node_id = node_id
        self.address = address
        self.secrets = secrets
        """How this gateway answers the node's questions for secrets (None: it answers none,
        and refuses secret rules for the node's sessions)."""
        scheme = "https" if tls is not None else "http"
        base = address if "://" in address else f"{scheme}://{address}"
        self._http = httpx.AsyncClient(
            base_url=base + PREFIX, verify=tls if tls is not None else True,
            timeout=httpx.Timeout(timeout_s, connect=5.0),
            limits=httpx.Limits(max_keepalive_connections=32, keepalive_expiry=60))
        self._channel = NodeChannel(
            node_id, base.replace("http", "ws", 1) + PREFIX + "/channel", tls,
            answers=None if secrets is None else functools.partial(secrets.answer, node_id))
        self._keeping: asyncio.Task[None] | None = None
        tracing = setup_tracing()
        self._tracer = None if tracing is None else tracing.tracer

    def __repr__(self) -> str:
        return f"<NodeClient {self.node_id} {self.address}>"

    async def close(self) -> None:
        if self._keeping is not None:
            self._keeping.cancel()
        await self._channel.close()
        await self._http.aclose()

    async def call(self, method: str, path: str, answer: type[M] | None = None, *,
                   session_id: str | None = None, **kwargs: Any) -> Any:
        """One request; its answer as ``answer`` (or the raw response when None)."""
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise NodeUnreachable(session_id or "-", f"its node {self.node_id} at "
                                  f"{self.address} did not answer ({exc!r})") from None
        if response.status_code >= 400:
            raise _error(response, session_id)
        if answer is None:
            return response
        return answer.model_validate_json(response.content)

    @contextlib.asynccontextmanager
    async def stream(self, path: str, body: BaseModel | None,
                     session_id: str) -> AsyncIterator[AsyncIterator[Frame]]:
        """A streamed answer, as frames (to a POST of ``body``; a GET without one)."""
        request = self._http.build_request(
            "GET" if body is None else "POST", path,
            content=None if body is None else body.model_dump_json(),
            headers={} if body is None else {"content-type": "application/json"},
            # An execution's events may be minutes apart: only a silent connection times out.
            timeout=httpx.Timeout(None, connect=5.0))
        async with self._streamed(request, session_id) as response:
            yield _frames(response, self.node_id, session_id)

    @contextlib.asynccontextmanager
    async def byte_stream(self, method: str, path: str, *, session_id: str,
                          **kwargs: Any) -> AsyncIterator[AsyncIterator[bytes]]:
        """A streamed answer as raw bytes (a file), its error raised before the first."""
        request = self._http.build_request(method, path, **kwargs)
        async with self._streamed(request, session_id) as response:
            yield _bytes(response, self.node_id, session_id)

    @contextlib.asynccontextmanager
    async def _streamed(self, request: httpx.Request,
                        session_id: str) -> AsyncIterator[httpx.Response]:
        """``request`` sent, its answer's head read: an error answer raised, a good one
        yielded to be read on, and closed after."""
        try:
            response = await self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise NodeUnreachable(session_id, f"its node {self.node_id} did not answer "
                                  f"({exc!r})") from None
        try:
            if response.status_code >= 400:
                await response.aread()
                raise _error(response, session_id)
            yield response
        finally:
            await response.aclose()

    @contextlib.asynccontextmanager
    async def execution(self, session_id: str,
                        submit: Submit) -> AsyncIterator[AsyncIterator[Frame]]:
        """The execution sent on the node's channel; its frames, to its end. The hop is a
        client span under the current one (the gateway's ``replgate.execute``), whose context
        the node continues."""
        if self._tracer is None:  # no tracing asked for: not even a no-op span per execution
            async with self._channel.stream(session_id, submit=submit) as frames:
                yield frames
            return
        with self._tracer.start_span("replgate.node.submit", kind=SpanKind.CLIENT,
                                     attributes={"replgate.node": self.node_id}) as span:
            carrier: dict[str, str] = {}
            propagate.inject(carrier, context=trace.set_span_in_context(span))
            async with self._channel.stream(session_id, submit=submit, trace=carrier) as frames:
                yield frames

    @property
    def brokers_secrets(self) -> bool:
        """Whether the node's sessions may have secret rules (this gateway has secrets)."""
        return self.secrets is not None and self.secrets.source is not None

    def keep_channel(self) -> None:
        """Open the channel in the background if it is not: the node asks for secrets on it.
        (A node out of reach costs the caller nothing: its attempt times out on its own.)"""
        if self._keeping is None or self._keeping.done():
            self._keeping = asyncio.get_running_loop().create_task(self._channel.keep_open())

    async def info(self) -> NodeInfo:
        info: NodeInfo = await self.call("GET", "/info", NodeInfo)
        return info

    async def create(self, request: CreateSession) -> SessionState:
        """A session made on the node (on its channel, like executions: the hot paths)."""
        async with self._channel.stream(request.session_id or "-", create=request) as frames:
            async for frame in frames:
                if frame.error is not None:
                    raise error_from(frame.error)
                if frame.created is not None:
                    return frame.created
        raise NodeUnreachable(request.session_id or "-", f"its node {self.node_id} ended "
                              "the request to make a session without an answer")

    async def sessions(self) -> list[SessionState]:
        response = await self.call("GET", "/sessions")
        return _STATES.validate_json(response.content)

    async def state(self, session_id: str) -> SessionState:
        state: SessionState = await self.call("GET", f"/sessions/{session_id}", SessionState,
                                              session_id=session_id)
        return state

    async def fork(self, session_id: str, request: ForkSession) -> list[SessionState]:
        response = await self.call("POST", f"/sessions/{session_id}/fork",
                                   session_id=session_id, content=request.model_dump_json(),
                                   headers={"content-type": "application/json"})
        return _STATES.validate_json(response.content)


async def _frames(response: httpx.Response, node_id: str,
                  session_id: str) -> AsyncIterator[Frame]:
    try:
        async for line in response.aiter_lines():
            if line:
                yield Frame.model_validate_json(line)
    except httpx.TransportError as exc:
        raise NodeUnreachable(session_id, f"its node {node_id} stopped answering "
                              f"({exc!r})") from None


async def _bytes(response: httpx.Response, node_id: str,
                 session_id: str) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.aiter_raw():
            yield chunk
    except httpx.TransportError as exc:
        raise NodeUnreachable(session_id, f"its node {node_id} stopped answering "
                              f"({exc!r})") from None


def _error(response: httpx.Response, session_id: str | None) -> KernelPoolError:
    try:
        return error_from(ErrorOut.model_validate_json(response.content))
    except ValueError:
        text = response.text[:300]
        return KernelPoolError(f"the node answered {response.status_code}: {text}"
                               if session_id is None else
                               f"session {session_id}: the node answered "
                               f"{response.status_code}: {text}")
