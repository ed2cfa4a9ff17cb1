"""Shell commands in a session's sandbox, as ``sandbox.commands`` (in the shape of E2B's).

Each command streams over a WebSocket of its own, so several may run at once, beside code.
``run`` waits for the end and returns a :class:`CommandResult`; with ``background=True`` it
returns a :class:`AsyncCommandHandle` at once, to ``wait()`` for or ``kill()``. A non-zero exit
code is data (``result.exit_code``), not an exception; a refused request raises.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import uuid
from collections.abc import Callable
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from gateway.wire import CommandDone, CommandResult

from ._errors import ReplgateError, TransportError
from ._stream import _closed_error, _refused_error, _rejected_error
from ._transport import Transport

OutputCallback = Callable[[str], object]
"""Called with each piece of stdout or stderr text; a plain function or a coroutine function."""


class AsyncCommandHandle:
    """A command running in the background: ``wait()`` for its result, or ``kill()`` it."""

    def __init__(self, command_id: str, task: asyncio.Task[CommandResult],
                 commands: AsyncCommands) -> None:
        self.id = command_id
        """The command's id (give it to ``commands.kill`` from elsewhere)."""
        self._task = task
        self._commands = commands

    async def wait(self) -> CommandResult:
        """The command's result once it has ended."""
        return await asyncio.shield(self._task)

    async def kill(self) -> bool:
        """Stop the command and its process group; ``False`` if it had already ended."""
        if self._task.done():
            return False
        return await self._commands.kill(self.id)

    def __repr__(self) -> str:
        return f"<AsyncCommandHandle {self.id} {'done' if self._task.done() else 'running'}>"


class AsyncCommands:
    """The shell of one session, as ``sandbox.commands``."""

    def __init__(self, transport: Transport, session_path: str) -> None:
        self._transport = transport
        self._path = session_path

    async def run(self, cmd: str, *, background: bool = False,
                  envs: dict[str, str] | None = None, cwd: str | None = None,
                  on_stdout: OutputCallback | None = None,
                  on_stderr: OutputCallback | None = None,
                  timeout: float | None = None,  # noqa: ASYNC109  (the gateway enforces it)
                  ) -> Any:
        """Run ``sh -c cmd`` in the sandbox (workspace as working folder, unless ``cwd``, a
        path relative to it), with ``envs`` added to the session's environment.

        ``timeout`` (seconds) is enforced by the gateway: the command and its process group
        are killed then (``status == "timeout"``). Returns a :class:`CommandResult`, or with
        ``background=True`` an :class:`AsyncCommandHandle` at once.
        """
        command_id = f"cmd-{uuid.uuid4().hex}"
        request: dict[str, Any] = {"type": "command", "cmd": cmd, "id": command_id}
        for key, value in (("env", envs), ("cwd", cwd), ("timeout_s", timeout)):
            if value is not None:
                request[key] = value
        socket = await self._open()
        try:
            await socket.send(json.dumps(request))
        except ConnectionClosed as exc:
            raise _closed(exc, command_id) from exc
        except BaseException:
            await socket.close()
            raise
        task = asyncio.ensure_future(_follow(socket, command_id, on_stdout, on_stderr))
        if background:
            return AsyncCommandHandle(command_id, task, self)
        return await task

    async def kill(self, command_id: str) -> bool:
        """Stop the running command ``command_id``; ``False`` when none runs under it."""
        response = await self._transport.request(
            "POST", f"{self._path}/commands/{command_id}/kill")
        return bool(response.json()["killed"])

    async def _open(self) -> ClientConnection:
        url = self._transport.websocket_url(f"{self._path}/ws")
        try:
            return await connect(url, additional_headers=self._transport.headers)
        except InvalidStatus as exc:
            raise _refused_error(exc.response.status_code, exc.response.body) from exc
        except (OSError, TimeoutError, WebSocketException) as exc:
            raise TransportError(f"Could not open the WebSocket {url} ({exc!r}). Check that "
                                 "the gateway runs there (base_url= / REPLGATE_URL).") from exc


def _closed(exc: ConnectionClosed, command_id: str) -> ReplgateError:
    code = exc.rcvd.code if exc.rcvd is not None else None
    if code is not None and 4400 <= code < 4600:  # refused: 4404 is a 404, ...
        return _closed_error(exc, command_id)
    return TransportError(f"The WebSocket closed before command {command_id} ended; the "
                          "gateway stops a command whose socket closes.")


async def _follow(socket: ClientConnection, command_id: str,
                  on_stdout: OutputCallback | None,
                  on_stderr: OutputCallback | None) -> CommandResult:
    """Read the command's events until its ``done``; the aggregate."""
    out: dict[str, list[str]] = {"stdout": [], "stderr": []}
    try:
        while True:
            try:
                message = json.loads(await socket.recv())
            except ConnectionClosed as exc:
                raise _closed(exc, command_id) from exc
            if not isinstance(message, dict):
                continue
            kind = message.get("type")
            if message.get("command_id") != command_id and not (
                    kind == "rejected" and message.get("execution_id") == command_id):
                continue
            if kind == "rejected":
                raise _rejected_error(message, command_id, "Command")
            if kind in out and isinstance(message.get("text"), str):
                out[kind].append(message["text"])
                callback = on_stdout if kind == "stdout" else on_stderr
                if callback is not None:
                    result = callback(message["text"])
                    if inspect.isawaitable(result):
                        await result
            elif kind == "done":
                done = CommandDone.model_validate(message)
                return CommandResult(id=command_id, exit_code=done.exit_code,
                                     stdout="".join(out["stdout"]),
                                     stderr="".join(out["stderr"]), truncated=done.truncated,
                                     status=done.status, duration_ms=done.duration_ms,
                                     reason=done.reason)
    except ValueError as exc:
        raise ReplgateError(f"The gateway sent a message this client cannot read: {exc}") from exc
    finally:
        await socket.close()
