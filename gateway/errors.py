"""The gateway's answers to errors: HTTP (FastAPI's handlers), WebSocket close codes, headers.

The errors and the one table of their statuses are :mod:`common.errors` (the node answers with
the same statuses); this module re-exports them, so the gateway imports its errors from here.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from common.errors import (
    DATABASE_AWAY,
    DOMAIN_ERRORS,
    STATUS_BY_ERROR,
    Conflict,
    Forbidden,
    GatewayError,
    InvalidInput,
    MalformedMessage,
    NotFound,
    TooManyRequests,
    Unauthorized,
    detail_for,
    is_database_error,
    status_for,
)

__all__ = [
    "DATABASE_AWAY",
    "DOMAIN_ERRORS",
    "RETRY_LATER",
    "STATUS_BY_ERROR",
    "WS_CLOSE_FORBIDDEN_ORIGIN",
    "WS_CLOSE_LAGGED",
    "Conflict",
    "Forbidden",
    "GatewayError",
    "InvalidInput",
    "MalformedMessage",
    "NotFound",
    "TooManyRequests",
    "Unauthorized",
    "close_code_for",
    "detail_for",
    "error_response",
    "headers_for",
    "install",
    "status_for",
]

logger = logging.getLogger(__name__)

RETRY_LATER = frozenset({429, 503, 507})
"""Statuses answered with ``Retry-After``."""

WS_CLOSE_FORBIDDEN_ORIGIN = 4403
WS_CLOSE_LAGGED = 1013
"""A watcher that fell behind: "try again later" (RFC 6455)."""


def close_code_for(exc: BaseException) -> int:
    """The WebSocket close code of a domain error: 4000 + its HTTP status (4404, 4401, ...)."""
    return 4000 + status_for(exc)


def headers_for(status: int) -> dict[str, str] | None:
    if status == 401:
        return {"WWW-Authenticate": "Bearer"}
    if status in RETRY_LATER:
        return {"Retry-After": "5"}
    return None


def error_response(exc: BaseException, **extra: Any) -> JSONResponse:
    """The JSON answer ``{"detail": ..., **extra}`` for a domain error."""
    status = status_for(exc)
    return JSONResponse({"detail": detail_for(exc), **extra}, status_code=status,
                        headers=headers_for(status))


def install(app: FastAPI) -> None:
    """Register the handlers that turn our errors into JSON ``{"detail": ...}`` answers."""

    async def handle(request: Request, exc: Exception) -> JSONResponse:
        if status_for(exc) >= 500:
            logger.error("%s %s failed: %s", request.method, request.url.path, exc)
        return error_response(exc)

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        if is_database_error(exc):
            logger.error("%s %s failed: the database: %s", request.method, request.url.path, exc)
            return error_response(exc)
        logger.exception("%s %s failed unexpectedly", request.method, request.url.path)
        return JSONResponse({"detail": "internal error; see the gateway's log"}, status_code=500)

    for kind in DOMAIN_ERRORS:
        app.add_exception_handler(kind, handle)
    app.add_exception_handler(Exception, unexpected)
