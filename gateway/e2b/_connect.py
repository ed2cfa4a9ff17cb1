"""Connect RPC for envd's services, served by the ``connectrpc`` library with pydantic messages.

E2B's SDKs speak Connect with its JSON codec only (the Python SDK's ``_ProtoJSONCodec``, the JS
SDK's ``useBinaryFormat: false``), so the messages here are pydantic models of the ProtoJSON
form of envd's protobuf messages (lowerCamelCase names, the proto names accepted too; int64 as
strings; enums by name). ``connectrpc`` does the protocol: unary and server-streaming framing,
envelopes, end-of-stream records, timeouts and Connect's error JSON. No code is generated.

:class:`SandboxRpc` is the ASGI app mounted under ``/e2b/sandbox``: it checks the sandbox and
its token from the request's headers, then hands the request to the service's Connect app with
the session in :data:`TARGET`.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.method import IdempotencyLevel, MethodInfo
from connectrpc.request import RequestContext
from connectrpc.server import ConnectASGIApplication, Endpoint
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel
from starlette.requests import HTTPConnection
from starlette.types import Receive, Scope, Send

from gateway.e2b._access import ENVD_PORT, find_sandbox, services
from gateway.e2b._errors import E2BError
from gateway.service import Gateway
from kernel_pool import SessionPort

M = TypeVar("M", bound=BaseModel)
Req = TypeVar("Req", bound=BaseModel)
Res = TypeVar("Res", bound=BaseModel)


class ProtoJSON(BaseModel):
    """A protobuf message in its JSON form."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class Empty(ProtoJSON):
    pass


class PydanticJSONCodec:
    """connectrpc's ``Codec`` for pydantic messages, under Connect's name ``json``."""

    def name(self) -> str:
        return "json"

    def encode(self, message: BaseModel) -> bytes:
        return message.model_dump_json(by_alias=True, exclude_none=True).encode()

    def decode(self, data: bytes | bytearray, message_class: type[M]) -> M:
        try:
            return message_class.model_validate_json(bytes(data) or b"{}")
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "message"
            raise ConnectError(Code.INVALID_ARGUMENT,
                               f"invalid request: {where}: {first.get('msg')}") from None


@dataclass(frozen=True)
class Target:
    """The sandbox a Connect call is for, found and authenticated by :class:`SandboxRpc`."""

    gateway: Gateway
    tenant: str
    session: SessionPort


TARGET: contextvars.ContextVar[Target] = contextvars.ContextVar("e2b_rpc_target")


def unary(service: str, name: str, request: type[Req], response: type[Res],
          function: Callable[[Req], Awaitable[Res]]) -> tuple[str, Endpoint[Req, Res]]:
    """A unary method, ``function(request) -> response``."""
    async def call(message: Req, ctx: RequestContext[Req, Res]) -> Res:
        return await function(message)

    info = MethodInfo(name=name, service_name=service, input=request, output=response,
                      idempotency_level=IdempotencyLevel.UNKNOWN)
    return f"/{service}/{name}", Endpoint.unary(method=info, function=call)


def server_stream(service: str, name: str, request: type[Req], response: type[Res],
                  function: Callable[[Req, RequestContext[Req, Res]], AsyncIterator[Res]],
                  ) -> tuple[str, Endpoint[Req, Res]]:
    """A server-streaming method, ``function(request, ctx)`` yielding responses (the context
    tells the call's deadline and headers)."""
    info = MethodInfo(name=name, service_name=service, input=request, output=response,
                      idempotency_level=IdempotencyLevel.UNKNOWN)
    return f"/{service}/{name}", Endpoint.server_stream(method=info, function=function)


class ConnectService(ConnectASGIApplication[None]):
    """One Connect service: its endpoints by path, JSON codec only, no compression needed."""

    def __init__(self, name: str, endpoints: Mapping[str, Any]) -> None:
        super().__init__(service=None, endpoints=lambda _svc: endpoints,
                         codecs=[PydanticJSONCodec()])
        self._name = name

    @property
    def path(self) -> str:
        return f"/{self._name}"


class SandboxRpc:
    """ASGI: ``/e2b/sandbox/<service>/<Method>`` to the service's Connect app, once the
    sandbox and its token are checked (failures in E2B's proxy shape: JSON, not Connect)."""

    def __init__(self, *services: ConnectService) -> None:
        self.services = {service.path.strip("/"): service for service in services}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        rpc_path = path[path.index("/e2b/sandbox/") + len("/e2b/sandbox"):]
        service = self.services.get(rpc_path.split("/")[1])
        connection = HTTPConnection(scope)
        try:
            if service is None:
                raise E2BError(404, f"no such service: {rpc_path}")
            gateway, sandboxes = services(connection)
            tenant, session = await find_sandbox(connection.headers, gateway, sandboxes, ENVD_PORT)
        except E2BError as exc:
            body = json.dumps({"code": exc.status, "message": exc.message}).encode()
            await send({"type": "http.response.start", "status": exc.status,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return
        token = TARGET.set(Target(gateway, tenant, session))
        try:
            # connectrpc types the ASGI messages as asgiref's TypedDicts, Starlette as mappings
            asgi: Any = service
            await asgi({**scope, "path": rpc_path, "root_path": ""}, receive, send)
        finally:
            TARGET.reset(token)


def not_offered(what: str) -> ConnectError:
    return ConnectError(Code.UNIMPLEMENTED, f"replgate does not offer {what}")
