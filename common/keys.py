"""API keys and approver keys: making them, hashing them, and reading them from settings.

A new key is ``e2b_`` followed by 64 lowercase hex digits (256 bits of randomness): the shape
E2B's SDKs check on the client side (some versions refuse any other key unless
``E2B_VALIDATE_API_KEY=false``), so one key serves replgate's API and E2B's SDKs alike. Keys made
before (``rg_`` and 43 URL-safe characters) and keys set in ``REPLGATE_API_KEYS`` keep working:
a key's shape is never checked, only its hash. Keys are only ever stored hashed
(:func:`hash_api_key`); the store compares hashes in constant time. Approver keys
(``REPLGATE_APPROVER_KEYS``) name a person of one tenant (:mod:`gateway.governance.approvals`).
Finding a key in a request is the gateway's (:mod:`gateway.auth`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import secrets

from pydantic import BaseModel

__all__ = [
    "API_KEY_PREFIX",
    "Approver",
    "generate_api_key",
    "hash_api_key",
    "parse_api_keys_setting",
    "parse_approver_keys",
]

API_KEY_PREFIX = "e2b_"

# Tenants end up in container labels, log lines and metrics, so keep them to a plain alphabet.
_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}")
"""An approver's name."""


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


class Approver(BaseModel):
    tenant: str
    name: str


def parse_approver_keys(value: str | None) -> list[tuple[Approver, str]]:
    """``tenant:name:key,...`` -> [(approver, key)]; ValueError names the entry (never the key)."""
    found: list[tuple[Approver, str]] = []
    if not value or not value.strip():
        return found
    for position, raw in enumerate(value.split(","), start=1):
        where = f"REPLGATE_APPROVER_KEYS entry {position}"
        parts = raw.strip().split(":", 2)
        if len(parts) != 3:
            raise ValueError(f"{where}: write it as tenant:name:key")
        tenant, name, key = parts
        if not _TENANT.fullmatch(tenant.strip()):
            raise ValueError(f"{where}: invalid tenant {tenant.strip()!r}: use 1 to 64 letters, "
                             "digits, '.', '_' or '-', starting with a letter or digit")
        if not _NAME.fullmatch(name.strip()):
            raise ValueError(f"{where}: the approver name {name.strip()!r} must be 1 to 64 "
                             "letters, digits or '._@+-'")
        key = key.strip()
        if len(key) < 16 or any(ch.isspace() for ch in key):
            raise ValueError(f"{where}: the key must be at least 16 characters, no spaces")
        found.append((Approver(tenant=tenant.strip(), name=name.strip()), key))
    keys = [key for _, key in found]
    if len(set(keys)) != len(keys):
        raise ValueError("REPLGATE_APPROVER_KEYS gives one key to two approvers")
    return found


SECRETS_KEY_MIN_BYTES = 32


def decode_secrets_key(value: str) -> bytes:
    """The master key ``REPLGATE_SECRETS_KEY`` holds (32 or more random bytes, base64), or
    ValueError saying how to make one (the message never holds the value)."""
    how = ("make one with: python -c 'import base64, os; "
           "print(base64.b64encode(os.urandom(32)).decode())'")
    try:
        master = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"REPLGATE_SECRETS_KEY is not base64 ({how})") from None
    if len(master) < SECRETS_KEY_MIN_BYTES:
        raise ValueError(f"REPLGATE_SECRETS_KEY must hold at least {SECRETS_KEY_MIN_BYTES} "
                         f"bytes, not {len(master)} ({how})")
    return master
