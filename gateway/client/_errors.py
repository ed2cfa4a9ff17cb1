"""What the client raises: infrastructure failures only.

    ReplgateError              every error below; carries status_code and detail
    ├── TransportError         the gateway could not be reached, or the connection was lost
    ├── AuthenticationError    401 (or a refused WebSocket): a missing or wrong API key
    ├── NotFoundError          404: no such session or file (another tenant's session too)
    ├── RateLimitError         429: too many requests; carries retry_after
    ├── InvalidRequestError    any other 4xx: the gateway refused the request, detail says why
    └── ServerError            5xx: the gateway itself failed

An exception in the sandboxed code, a timeout or a crashed kernel is not raised: it is data, in
``Execution.status`` ("error", "timeout", "interrupted", "died") and ``Execution.error``.
"""

from __future__ import annotations

import json
from typing import Any

import httpx


class ReplgateError(Exception):
    """Base of every error the client raises.

    ``status_code`` is the HTTP status (``None`` when no answer came) and ``detail`` the
    gateway's ``detail`` field (a sentence, or FastAPI's list of validation errors).
    """

    def __init__(self, message: str, *, status_code: int | None = None,
                 detail: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.detail = detail


class TransportError(ReplgateError):
    """The gateway could not be reached, or the connection to it broke."""


class AuthenticationError(ReplgateError):
    """The gateway refused the API key (HTTP 401), or no key was given."""


class NotFoundError(ReplgateError):
    """No such session or file (HTTP 404); another tenant's session looks the same."""


class RateLimitError(ReplgateError):
    """Too many requests (HTTP 429); ``retry_after`` is the wait in seconds, when given."""

    def __init__(self, message: str, *, status_code: int | None = 429, detail: Any = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message, status_code=status_code, detail=detail)
        self.retry_after = retry_after


class InvalidRequestError(ReplgateError):
    """The gateway refused the request (a 4xx other than 401, 404, 429); ``detail`` says why."""


class ServerError(ReplgateError):
    """The gateway failed (HTTP 5xx); not caused by the request or the sandboxed code."""


def error_for_status(status_code: int, detail: Any, *,
                     retry_after: float | None = None) -> ReplgateError:
    """The exception for an error answer of the gateway, with a message saying what to do."""
    said = describe_detail(detail)
    if status_code == 401:
        return AuthenticationError(
            f"The gateway refused the API key (HTTP 401: {said}). Pass api_key=... or set "
            "REPLGATE_API_KEY to a key the gateway knows.", status_code=401, detail=detail)
    if status_code == 404:
        return NotFoundError(
            f"Not found (HTTP 404: {said}). Check the session id and path; a deleted session or "
            "one created with another API key answers 404 too.", status_code=404, detail=detail)
    if status_code == 429:
        wait = f"after {retry_after:g} s" if retry_after is not None else "later"
        return RateLimitError(
            f"Rate limited (HTTP 429: {said}). Retry {wait}, or send fewer requests at once.",
            detail=detail, retry_after=retry_after)
    if 400 <= status_code < 500:
        return InvalidRequestError(
            f"The gateway refused the request (HTTP {status_code}): {said}.",
            status_code=status_code, detail=detail)
    return ServerError(
        f"The gateway failed (HTTP {status_code}: {said}). This is not caused by your code; "
        "retry, and if it persists read the gateway's logs.", status_code=status_code,
        detail=detail)


def error_from_response(response: httpx.Response) -> ReplgateError:
    """The exception for an httpx error response (its JSON ``detail``, else its text)."""
    try:
        detail = response.json()["detail"]
    except (ValueError, KeyError, TypeError):
        detail = response.text or response.reason_phrase
    return error_for_status(response.status_code, detail,
                            retry_after=_seconds(response.headers.get("retry-after")))


def describe_detail(detail: Any) -> str:
    """A gateway ``detail`` as one line: FastAPI's validation errors become ``loc: msg``."""
    if isinstance(detail, str):
        return detail.rstrip(".")
    if isinstance(detail, list) and all(isinstance(item, dict) for item in detail):
        return "; ".join(
            f"{'.'.join(str(part) for part in item.get('loc', []))}: {item.get('msg', item)}"
            for item in detail)
    return json.dumps(detail, default=str)


def _seconds(value: str | None) -> float | None:
    # Retry-After may also be an HTTP date; the gateway sends seconds, so a date is ignored.
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
