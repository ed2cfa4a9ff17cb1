"""The asynchronous sandbox: one session on a replgate gateway."""

from __future__ import annotations

from collections.abc import Awaitable
from types import TracebackType
from typing import Any

import httpx

from gateway.wire import CommandResult, Execution, FileInfo
from gateway.wire import SessionOut as SessionInfo
from kernel_pool import NetworkPolicy

from ._commands import AsyncCommands
from ._errors import NotFoundError
from ._files import AsyncFiles
from ._stream import (
    DisplayCallback,
    ErrorCallback,
    ExecutionStream,
    Handlers,
    StreamCallback,
    TransferCallback,
)
from ._tools import SandboxTools
from ._transport import EXECUTE_TIMEOUT, Transport


class AsyncSandbox:
    """A persistent Python REPL in a hardened sandbox, with a workspace of files.

    Make one with :meth:`create` (a new session) or :meth:`connect` (an existing one). Used as
    ``async with``, the session is deleted on exit. An exception in the sandboxed code is not
    raised: it is ``Execution.status == "error"`` and ``Execution.error``; a timeout is
    ``status == "timeout"``. Failures of the gateway raise :class:`ReplgateError`.
    """

    def __init__(self, info: SessionInfo, transport: Transport) -> None:
        """Wrap a session already known to ``transport``; use :meth:`create` or :meth:`connect`."""
        self._info = info
        self._transport = transport
        self._path = f"/v1/sessions/{info.id}"
        self._stream = ExecutionStream(transport.websocket_url(f"{self._path}/ws"),
                                       transport.headers)
        self._closed = False
        self.files = AsyncFiles(transport, self._path)
        """The session's workspace: ``write``, ``read``, ``list``."""
        self.commands = AsyncCommands(transport, self._path)
        """The session's shell: ``run`` (streaming, background), ``kill``."""
        self.tools = SandboxTools(ToolSessionOf(self))
        """This session as tools for a model: definitions for OpenAI and Anthropic, and
        ``call(name, arguments)`` to run a tool call (see :class:`SandboxTools`)."""

    @classmethod
    async def create(cls, *, base_url: str | None = None, api_key: str | None = None,
                     profile: str | None = None, env: dict[str, str] | None = None,
                     timeout_s: float | None = None,
                     metadata: dict[str, Any] | None = None) -> AsyncSandbox:
        """Start a new session.

        ``base_url`` and ``api_key`` default to the gateway of this machine: ``REPLGATE_URL``
        (else ``http://127.0.0.1:8000``) and ``REPLGATE_API_KEY`` (else the key ``replgate
        serve`` keeps in its state folder, ``REPLGATE_STATE_DIR``), as ``replgate mcp`` finds
        it. ``profile`` picks the gateway's
        sandbox profile, ``env`` the only environment variables the code sees, ``timeout_s``
        the default time limit of each execution.
        """
        body = {key: value for key, value in {"profile": profile, "env": env,
                                              "timeout_s": timeout_s,
                                              "metadata": metadata}.items()
                if value is not None}
        transport = Transport(base_url, api_key)
        return await cls._open(transport, transport.request("POST", "/v1/sessions", json=body))

    @classmethod
    async def connect(cls, session_id: str, *, base_url: str | None = None,
                      api_key: str | None = None) -> AsyncSandbox:
        """Attach to the existing session ``session_id``; :class:`NotFoundError` if it is gone."""
        transport = Transport(base_url, api_key)
        return await cls._open(transport, transport.request("GET", f"/v1/sessions/{session_id}"))

    @classmethod
    async def _open(cls, transport: Transport,
                    answer: Awaitable[httpx.Response]) -> AsyncSandbox:
        try:
            response = await answer
            return cls(SessionInfo.model_validate(response.json()), transport)
        except BaseException:
            await transport.aclose()
            raise

    @property
    def session_id(self) -> str:
        """The session's id, for :meth:`connect` from elsewhere."""
        return self._info.id

    async def run_code(self, code: str, *, on_stdout: StreamCallback | None = None,
                       on_stderr: StreamCallback | None = None,
                       on_display: DisplayCallback | None = None,
                       on_error: ErrorCallback | None = None,
                       on_transfer: TransferCallback | None = None,
                       timeout: float | None = None,  # noqa: ASYNC109  (see docstring)
                       whole_lines: bool = True,
                       language: str | None = None,
                       context_id: str | None = None,
                       ) -> Execution:
        """Run ``code`` in the session's kernel, streaming its events over the WebSocket.

        Each callback (a function or a coroutine function) gets the typed event as it arrives:
        ``on_display`` gets ``display`` and ``result`` events. ``on_stdout``/``on_stderr`` get
        whole lines (an unfinished one once the code ends it, or at the next display, error or
        the end); ``whole_lines=False`` passes each text as the gateway sent it. When the session
        is paused, the code's run resumes it first: ``on_transfer`` gets that resume's progress
        (a :class:`TransferFrame`: ``done_bytes`` of ``total_bytes``, ``state``) before any
        output. ``timeout``
        (seconds) overrides the session's time limit, which the gateway enforces (the answer is
        then ``status == "timeout"``). Returns the aggregate once the execution is done. Cancelling
        the call does not stop the code in the kernel: use :meth:`interrupt` for that.
        ``language`` (``"r"``, ``"javascript"``, ``"typescript"``, ``"bash"``; Python by
        default) runs it in that language's context of the session, ``context_id`` in that
        context (the languages the image offers: ``/v1/sessions/{id}/contexts``'s docs).
        """
        handlers = Handlers(on_stdout=on_stdout, on_stderr=on_stderr, on_display=on_display,
                            on_error=on_error, on_transfer=on_transfer,
                            whole_lines=whole_lines)
        return await self._stream.run(code, timeout, handlers, language=language,
                                      context_id=context_id)

    async def execute_http(self, code: str, *,
                           timeout: float | None = None,  # noqa: ASYNC109  (see docstring)
                           language: str | None = None,
                           context_id: str | None = None,
                           ) -> Execution:
        """Run ``code`` through one plain HTTP request, without streaming.

        ``timeout`` (seconds) is the time limit the gateway enforces on the code, as in
        :meth:`run_code`, not a limit on waiting for the answer; ``language`` and
        ``context_id`` too are :meth:`run_code`'s.
        """
        body: dict[str, Any] = {"code": code}
        for name, value in (("timeout_s", timeout), ("language", language),
                            ("context_id", context_id)):
            if value is not None:
                body[name] = value
        response = await self._transport.request("POST", f"{self._path}/execute", json=body,
                                                 limits=EXECUTE_TIMEOUT)
        return Execution.model_validate(response.json())

    async def interrupt(self) -> bool:
        """Interrupt the running execution; ``False`` when nothing was running."""
        response = await self._transport.request("POST", f"{self._path}/interrupt")
        return bool(response.json()["interrupted"])

    async def restart(self) -> SessionInfo:
        """Restart the kernel: variables are gone, files are kept, the count starts at 1 again."""
        response = await self._transport.request("POST", f"{self._path}/restart",
                                                 limits=EXECUTE_TIMEOUT)
        self._info = SessionInfo.model_validate(response.json())
        return self._info

    async def pause(self) -> SessionInfo:
        """Keep the session on disk and free its kernel; ``info.paused_with`` says what was
        kept and ``info.not_kept`` what was not. Any later run resumes it by itself."""
        response = await self._transport.request("POST", f"{self._path}/pause",
                                                 limits=EXECUTE_TIMEOUT)
        self._info = SessionInfo.model_validate(response.json())
        return self._info

    async def resume(self) -> SessionInfo:
        """Run a paused session again, every kept variable as it was."""
        response = await self._transport.request("POST", f"{self._path}/resume",
                                                 limits=EXECUTE_TIMEOUT)
        self._info = SessionInfo.model_validate(response.json())
        return self._info

    async def fork(self, count: int = 1,
                   metadata: dict[str, Any] | None = None) -> list[SessionInfo]:
        """``count`` new sessions with this one's variables and a copy of its files (this one
        goes on unchanged); drive each with ``AsyncSandbox.connect(info.id, ...)``."""
        response = await self._transport.request(
            "POST", f"{self._path}/fork", json={"count": count, "metadata": metadata or {}},
            limits=EXECUTE_TIMEOUT)
        return [SessionInfo.model_validate(item) for item in response.json()]

    async def info(self) -> SessionInfo:
        """The session as the gateway sees it now (status, execution count, ...)."""
        response = await self._transport.request("GET", self._path)
        self._info = SessionInfo.model_validate(response.json())
        return self._info

    async def notebook(self) -> dict[str, Any]:
        """The session's history as an nbformat v4 notebook (JSON), outputs included."""
        response = await self._transport.request("GET", f"{self._path}/notebook")
        notebook: dict[str, Any] = response.json()
        return notebook

    async def network(self) -> NetworkPolicy:
        """The network policy the sandbox runs under (its own, else its profile's)."""
        response = await self._transport.request("GET", f"{self._path}/network")
        return NetworkPolicy.model_validate(response.json())

    async def close(self) -> None:
        """Delete the session (its kernel and workspace) and close the connections.

        Closing twice, or closing a session that is already gone, is not an error.
        """
        if self._closed:
            return
        self._closed = True
        try:
            await self._transport.request("DELETE", self._path)
        except NotFoundError:
            pass  # already gone, which is what closing asks for
        finally:
            try:
                await self._stream.aclose()
            finally:
                await self._transport.aclose()

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else self._info.status
        return (f"<AsyncSandbox {self._info.id} profile={self._info.profile} {state} "
                f"at {self._transport.base_url}>")


class ToolSessionOf:
    """An :class:`AsyncSandbox` as the :class:`ToolSession` the tools run on."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def execute(self, code: str, timeout_s: float | None,
                      language: str | None = None) -> Execution:
        return await self._sandbox.run_code(code, timeout=timeout_s, language=language)

    async def write_file(self, path: str, data: bytes) -> int:
        return (await self._sandbox.files.write(path, data)).size

    async def read_file(self, path: str) -> bytes:
        return await self._sandbox.files.read(path)

    async def list_files(self) -> list[FileInfo]:
        return await self._sandbox.files.list()

    async def restart(self) -> None:
        await self._sandbox.restart()

    async def notebook(self) -> dict[str, Any]:
        return await self._sandbox.notebook()

    async def run_command(self, cmd: str, timeout_s: float | None) -> CommandResult:
        result: CommandResult = await self._sandbox.commands.run(cmd, timeout=timeout_s)
        return result

    async def fork(self, count: int) -> list[str]:
        return [info.id for info in await self._sandbox.fork(count)]

    async def network(self) -> NetworkPolicy:
        return await self._sandbox.network()
