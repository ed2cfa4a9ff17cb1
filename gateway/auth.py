"""API keys: making them, reading them from settings, and finding them in a request.

A new key is ``e2b_`` followed by 64 lowercase hex digits (256 bits of randomness): the shape
E2B's SDKs check on the client side (some versions refuse any other key unless
``E2B_VALIDATE_API_KEY=false``), so one key serves replgate's API and E2B's SDKs alike. Keys made
before (``rg_`` and 43 URL-safe characters) and keys set in ``REPLGATE_API_KEYS`` keep working:
a key's shape is never checked, only its hash. Keys are only ever stored hashed
(:func:`hash_api_key`); the store compares hashes in constant time.
Requests carry a key as ``Authorization: Bearer <key>``, Jupyter's ``Authorization: token <key>``,
or, for browsers' WebSockets, a ``?token=<key>`` query value.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Mapping
from urllib.parse import urlsplit

__all__ = [
    "API_KEY_PREFIX",
    "extract_token",
    "generate_api_key",
    "hash_api_key",
    "origin_allowed",
    "parse_api_keys_setting",
]

API_KEY_PREFIX = "e2b_"

# Tenants end up in container labels, log lines and metrics, so keep them to a plain alphabet.
_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SCHEMES = frozenset({"bearer", "token"})


def generate_api_key() -> str:
    """A new random API key: ``e2b_`` + ``secrets.token_hex(32)``, as E2B's clients expect."""
    return API_KEY_PREFIX + secrets.token_hex(32)


def hash_api_key(key: str) -> str:
    """The sha256 hex digest under which a key is stored (the key itself never is)."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def parse_api_keys_setting(value: str) -> dict[str, list[str]]:
    """Parse ``REPLGATE_API_KEYS`` (``"tenant:key,tenant2:key2"``) into ``{tenant: [keys]}``.

    A tenant may have several keys (repeat the tenant). Whitespace around entries is ignored,
    and an empty or blank setting gives ``{}``. A key may itself contain ``:``; only the first
    one separates the tenant.

    Raises:
        ValueError: an entry is empty, lacks the ``:``, has an empty or invalid tenant or an
            empty key, or one key is given to two tenants. The message names the entry by its
            position and never repeats the key, since it is a secret.
    """
    result: dict[str, list[str]] = {}
    owner: dict[str, str] = {}
    if not value.strip():
        return result
    for position, raw in enumerate(value.split(","), start=1):
        entry = raw.strip()
        where = f"REPLGATE_API_KEYS entry {position}"
        if not entry:
            raise ValueError(f"{where} is empty; write comma-separated tenant:key pairs")
        tenant, colon, key = entry.partition(":")
        tenant, key = tenant.strip(), key.strip()
        if not colon:
            raise ValueError(f"{where} has no ':'; write it as tenant:key")
        if not tenant:
            raise ValueError(f"{where} has an empty tenant; write it as tenant:key")
        if not _TENANT.fullmatch(tenant):
            raise ValueError(
                f"{where} has an invalid tenant {tenant!r}: use 1 to 64 letters, digits, '.', "
                "'_' or '-', starting with a letter or digit"
            )
        if not key:
            raise ValueError(f"{where} (tenant {tenant!r}) has an empty key")
        if any(ch.isspace() for ch in key):
            raise ValueError(f"{where} (tenant {tenant!r}) has whitespace inside its key")
        previous = owner.setdefault(key, tenant)
        if previous != tenant:
            raise ValueError(
                f"{where} gives tenant {tenant!r} a key already given to tenant {previous!r}; "
                "each key must belong to one tenant"
            )
        keys = result.setdefault(tenant, [])
        if key not in keys:
            keys.append(key)
    return result


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
