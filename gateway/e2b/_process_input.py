"""envd's ``process.Process`` methods that reach a running command's input: ``SendInput``,
``StreamInput``, ``CloseStdin`` and ``Update`` (its terminal's size), by the command's pid."""

from __future__ import annotations

import base64
import contextlib
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.method import IdempotencyLevel, MethodInfo
from connectrpc.request import RequestContext
from connectrpc.server import Endpoint
from pydantic import ValidationError

from gateway.e2b._connect import TARGET, Empty
from gateway.e2b._process_models import (
    CloseStdinRequest,
    ProcessInput,
    ProcessSelector,
    SendInputRequest,
    StreamInputRequest,
    UpdateRequest,
)
from gateway.errors import GatewayError, status_for
from kernel_pool import KernelPoolError, PtySize

SERVICE = "process.Process"
_CODES = {400: Code.INVALID_ARGUMENT, 409: Code.FAILED_PRECONDITION, 413: Code.INVALID_ARGUMENT,
          429: Code.RESOURCE_EXHAUSTED}


def _input_bytes(given: ProcessInput) -> bytes:
    try:
        return base64.b64decode(given.stdin or given.pty or "", validate=True)
    except ValueError:
        raise ConnectError(Code.INVALID_ARGUMENT, "input is not base64") from None


@contextlib.contextmanager
def _as_connect_errors(selector: ProcessSelector) -> Iterator[None]:
    """The pool's refusals of a command's input as Connect's codes."""
    try:
        yield
    except (GatewayError, KernelPoolError) as exc:
        code = status_for(exc)
        if code == 404:
            wanted = selector.model_dump(exclude_none=True)
            raise ConnectError(Code.NOT_FOUND, f"no running command with {wanted}") from None
        raise ConnectError(_CODES.get(code, Code.UNAVAILABLE), str(exc)) from None


class ProcessInputs(ABC):
    """The input methods of the process service."""

    @abstractmethod
    def _command_of(self, session_id: str, selector: ProcessSelector) -> str:
        """The command id of the selected process."""

    async def send_input(self, request: SendInputRequest) -> Empty:
        target = TARGET.get()
        data = _input_bytes(request.input)
        command_id = self._command_of(target.session.id, request.process)
        with _as_connect_errors(request.process):
            await target.session.send_command_input(command_id, data)
        return Empty()

    async def close_stdin(self, request: CloseStdinRequest) -> Empty:
        target = TARGET.get()
        command_id = self._command_of(target.session.id, request.process)
        with _as_connect_errors(request.process):
            await target.session.close_command_input(command_id)
        return Empty()

    async def update(self, request: UpdateRequest) -> Empty:
        target = TARGET.get()
        command_id = self._command_of(target.session.id, request.process)
        if request.pty is None or request.pty.size is None:
            raise ConnectError(Code.INVALID_ARGUMENT, "pty.size is missing: give the "
                                                      "terminal's new cols and rows")
        try:
            size = PtySize(cols=request.pty.size.cols, rows=request.pty.size.rows)
        except ValidationError:
            raise ConnectError(Code.INVALID_ARGUMENT, "pty.size: cols and rows must be "
                                                      "from 1 to 1000") from None
        with _as_connect_errors(request.process):
            await target.session.resize_command(command_id, size)
        return Empty()

    async def stream_input(self, messages: AsyncIterator[StreamInputRequest],
                           _ctx: RequestContext[StreamInputRequest, Empty]) -> Empty:
        target = TARGET.get()
        selector: ProcessSelector | None = None
        command_id = ""
        async for message in messages:
            if message.start is not None:
                selector = message.start.process
                command_id = self._command_of(target.session.id, selector)
            elif message.data is not None:
                if selector is None:
                    raise ConnectError(Code.INVALID_ARGUMENT, "the input stream's first "
                                                              "message must be its start")
                data = _input_bytes(message.data.input)
                with _as_connect_errors(selector):
                    await target.session.send_command_input(command_id, data)
        return Empty()


def client_stream(name: str, function: Callable[
        [AsyncIterator[StreamInputRequest], RequestContext[StreamInputRequest, Empty]],
        Awaitable[Empty]]) -> tuple[str, Endpoint[StreamInputRequest, Empty]]:
    info = MethodInfo(name=name, service_name=SERVICE, input=StreamInputRequest, output=Empty,
                      idempotency_level=IdempotencyLevel.UNKNOWN)
    return f"/{SERVICE}/{name}", Endpoint.client_stream(method=info, function=function)
