"""API keys in requests: where a request carries its key, and whose origin a WebSocket may have.

Requests carry a key as ``Authorization: Bearer <key>``, Jupyter's ``Authorization: token <key>``,
or, for browsers' WebSockets, a ``?token=<key>`` query value. Making keys, hashing them and reading
them from settings is :mod:`common.keys`' (the node makes keys too).
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

__all__ = ["extract_token", "origin_allowed"]

_SCHEMES = frozenset({"bearer", "token"})


def extract_token(authorization_header: str | None, query_token: str | None) -> str | None:
    """The API key a request presents, or None.

    The ``Authorization`` header wins when it holds ``Bearer <key>`` or ``token <key>`` (the
    scheme in any case); otherwise the ``?token=`` query value is used. Blank values count as
    absent. This only finds the key: checking it is the store's job.
    """
    if authorization_header:
        scheme, _, credentials = authorization_header.strip().partition(" ")
        credentials = credentials.strip()
        if scheme.lower() in _SCHEMES and credentials:
            return credentials
    if query_token and query_token.strip():
        return query_token.strip()
    return None


def origin_allowed(headers: Mapping[str, str], allowed: list[str]) -> bool:
    """A WebSocket's ``Origin`` (browsers send one) is the gateway's own or a configured one."""
    origin = headers.get("origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc == headers.get("host", "") or origin in allowed
