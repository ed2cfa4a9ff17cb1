"""JSON request bodies, whatever their ``Content-Type`` says (CONTRACT.md, HTTP API).

``curl -d '{...}'`` sends ``application/x-www-form-urlencoded`` and some clients send no type at
all; FastAPI reads either as raw bytes and answers 422 to a perfectly good JSON body. Here, once
for every route that takes a JSON body, the request is typed ``application/json`` before the
route reads it; routes that take raw bytes (the file ``PUT``) or forms, and everything that is
not a FastAPI route (``/mcp``), are left alone. A body that is not JSON is a 422 whose
``detail`` is a sentence, not FastAPI's list.

The route is known only once the router has matched it, which happens inside the app; the
middleware therefore looks at it when the route first reads its body (``scope["route"]`` is set
by then, and the route reads its ``Content-Type`` only after the body).
"""

from __future__ import annotations

import email.message

from fastapi import FastAPI, Request, params
from fastapi.exception_handlers import (
    http_exception_handler,
    request_validation_exception_handler,
)
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})
_JSON_TYPE = (b"content-type", b"application/json")


class JsonBodies:
    """ASGI middleware: the body of a route that takes JSON is read as JSON."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _WITH_BODY:
            await self.app(scope, receive, send)
            return
        first = True

        async def typed_receive() -> Message:
            nonlocal first
            if first:
                first = False
                if _takes_json(scope.get("route")) and not _is_json_type(scope):
                    scope["headers"] = [*(h for h in scope["headers"] if h[0] != b"content-type"),
                                        _JSON_TYPE]
            return await receive()

        await self.app(scope, typed_receive, send)


def _takes_json(route: object) -> bool:
    if not isinstance(route, APIRoute) or route.body_field is None:
        return False
    return not isinstance(route.body_field.field_info, params.Form)


def _is_json_type(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            message = email.message.Message()
            message["content-type"] = value.decode("latin-1")
            subtype = message.get_content_subtype()
            return message.get_content_maintype() == "application" and (
                subtype == "json" or subtype.endswith("+json"))
    return False


def _not_json(detail: str) -> JSONResponse:
    return JSONResponse({"detail": f"the request body is not JSON ({detail}); "
                                   "send a JSON object"}, status_code=422)


async def _on_validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    for error in exc.errors():
        if error.get("type") == "json_invalid":
            where = error.get("loc", ("body", "?"))[-1]
            return _not_json(f"{error.get('ctx', {}).get('error', 'invalid')} at character {where}")
    return await request_validation_exception_handler(request, exc)


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    # FastAPI answers 400 "There was an error parsing the body" to bytes that are not UTF-8.
    if isinstance(exc.__cause__, UnicodeDecodeError):
        return _not_json("it is not UTF-8 text")
    return await http_exception_handler(request, exc)


def install(app: FastAPI) -> None:
    """JSON bodies whatever their type, and a sentence for a body that is not JSON."""
    app.add_middleware(JsonBodies)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(HTTPException, _on_http_error)
