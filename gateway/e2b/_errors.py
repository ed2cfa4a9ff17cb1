"""E2B's error shapes, one per plane, and the route class that answers the control plane in it.

    control plane (``/e2b``)        ``{"code": <status>, "message": <sentence>}``
    envd's HTTP API (``/files``)    the same shape
    code interpreter (``/execute``) plain text, the status telling the SDK which error to raise
    Connect RPC (filesystem, process) Connect's own ``{"code": "not_found", "message": ...}``

replgate's domain errors (``gateway.errors.DOMAIN_ERRORS``, with the statuses of its one table)
and FastAPI's validation errors are translated here, so no E2B client ever meets replgate's
``{"detail": ...}`` shape.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import ValidationError

from gateway.errors import DOMAIN_ERRORS, detail_for, status_for

logger = logging.getLogger(__name__)


class E2BError(Exception):
    """An answer in E2B's shape: the status and a sentence for the user."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def unsupported(feature: str, hint: str = "") -> E2BError:
    """What replgate does not offer: 400 with a sentence naming it (never a hang or a 500)."""
    return E2BError(400, f"replgate does not offer {feature}{'; ' + hint if hint else ''}")


def error_json(status: int, message: str, **extra: Any) -> JSONResponse:
    """E2B's API error body (``Error`` in its OpenAPI: ``code`` and ``message``)."""
    return JSONResponse({"code": status, "message": message, **extra}, status_code=status)


def translate(exc: Exception) -> E2BError | None:
    """replgate's errors as E2B's; None for anything unexpected (a bug: logged, then 500)."""
    if isinstance(exc, E2BError):
        return exc
    if isinstance(exc, DOMAIN_ERRORS):
        return E2BError(status_for(exc), str(detail_for(exc)))
    if isinstance(exc, RequestValidationError | ValidationError):
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error.get('loc', ())) or 'body'}: {error.get('msg')}"
            for error in exc.errors())
        return E2BError(400, f"invalid request: {problems}")
    if isinstance(exc, HTTPException):
        return E2BError(exc.status_code, str(exc.detail))
    if isinstance(exc, json.JSONDecodeError | UnicodeDecodeError):
        return E2BError(400, f"the body is not valid JSON: {exc}")
    return None


def answer(exc: Exception, request: Request, render: Callable[[E2BError], Response]) -> Response:
    """``exc`` answered by ``render`` in one plane's shape; anything unexpected (a bug) is
    raised again, to be logged and answered 500."""
    error = translate(exc)
    if error is None:
        raise exc
    if error.status >= 500 and error.status != 502:  # 502: E2B's "not found"
        logger.error("%s %s failed: %s", request.method, request.url.path, error)
    return render(error)


class _TranslatingRoute(APIRoute):
    """A route whose errors are answered by :meth:`render`, in one plane's shape."""

    @staticmethod
    def render(error: E2BError) -> Response:
        raise NotImplementedError

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                return answer(exc, request, self.render)

        return route


class E2BRoute(_TranslatingRoute):
    """Answers every error of its endpoint in E2B's JSON shape."""

    @staticmethod
    def render(error: E2BError) -> Response:
        return error_json(error.status, error.message)


class PlainTextRoute(_TranslatingRoute):
    """Answers every error of its endpoint as plain text, as E2B's code interpreter does."""

    @staticmethod
    def render(error: E2BError) -> Response:
        return Response(error.message, status_code=error.status, media_type="text/plain")
