"""Domain errors to HTTP statuses and WebSocket close codes, in one place."""

from __future__ import annotations

import logging
import sqlite3

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from kernel_pool import exceptions as pool_errors

logger = logging.getLogger(__name__)


class GatewayError(Exception):
    """An error the gateway itself raises, with the HTTP status it maps to."""

    status_code = 400

    def __init__(self, detail: str, status_code: int | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        if status_code is not None:
            self.status_code = status_code


class Unauthorized(GatewayError):
    status_code = 401


class TooManyRequests(GatewayError):
    status_code = 429


class FileMissing(GatewayError):
    status_code = 404


STATUS_BY_ERROR: list[tuple[type[Exception], int]] = [
    (pool_errors.SessionNotFound, 404),
    (pool_errors.SessionClosed, 404),
    (pool_errors.ProfileNotFound, 400),
    (pool_errors.CapacityError, 503),
    (pool_errors.QueueFull, 429),
    (pool_errors.TooManyCommands, 429),
    (pool_errors.InvalidRequest, 400),
    (pool_errors.PathOutsideWorkspace, 400),
    (pool_errors.WorkspaceError, 400),
    (pool_errors.KernelStartError, 503),
    (pool_errors.BackendError, 503),
    (pool_errors.KernelPoolError, 500),
]

WS_CLOSE_UNAUTHORIZED = 4401
WS_CLOSE_FORBIDDEN_ORIGIN = 4403
WS_CLOSE_NOT_FOUND = 4404


def status_for(exc: Exception) -> int:
    if isinstance(exc, GatewayError):
        return exc.status_code
    for kind, status in STATUS_BY_ERROR:
        if isinstance(exc, kind):
            return status
    return 500


def install(app: FastAPI) -> None:
    """Register the handlers that turn our errors into JSON ``{"detail": ...}`` answers."""

    async def handle(request: Request, exc: Exception) -> JSONResponse:
        status = status_for(exc)
        headers = {"Retry-After": "5"} if status in (429, 503) else None
        if status == 401:
            headers = {"WWW-Authenticate": "Bearer"}
        if status >= 500:
            logger.error("%s %s failed: %s", request.method, request.url.path, exc)
        return JSONResponse({"detail": str(exc)}, status_code=status, headers=headers)

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, sqlite3.OperationalError) and "full" in str(exc):
            logger.error("%s %s failed: the database is full", request.method, request.url.path)
            return JSONResponse({"detail": "the gateway's state directory is full (its database "
                                 "cannot grow); delete sessions or free disk space"},
                                status_code=507)
        logger.exception("%s %s failed unexpectedly", request.method, request.url.path)
        return JSONResponse({"detail": "internal error; see the gateway's log"}, status_code=500)

    app.add_exception_handler(GatewayError, handle)
    app.add_exception_handler(pool_errors.KernelPoolError, handle)
    app.add_exception_handler(Exception, unexpected)
