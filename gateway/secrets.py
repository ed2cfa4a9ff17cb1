"""Tenants' secrets: written and deleted through the API, never read back; opened only for the
egress broker (:mod:`kernel_pool._broker`), which puts them into the requests a session's rules
match (docs/secrets.md).

At rest a value is sealed with AES-256-GCM under a key derived by HKDF-SHA256 from
``REPLGATE_SECRETS_KEY``, with the tenant and the name as associated data: a row moved to
another tenant or name, or opened with another master key, fails its tag. Without the setting
the API answers 409 (nothing is ever stored in the clear). No value enters a log line, a span,
an error's detail or an audit record: the errors here name the secret, never its value.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Awaitable, Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from pydantic import SecretStr

from common.errors import Conflict, InvalidInput, NotFound
from common.keys import decode_secrets_key
from gateway.records.secrets import SecretRecord
from gateway.store import Store

__all__ = ["MAX_VALUE_BYTES", "NAME_PATTERN", "SecretBox", "SecretLookup", "Secrets", "check_name",
           "check_value"]

NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
"""A secret's name: what ``{secret:NAME}`` may hold."""
MAX_VALUE_BYTES = 8 * 1024
_NONCE = 12
_FORMAT = "v1:"

SecretLookup = Callable[[str], Awaitable[str | None]]
"""The value of one of a tenant's secrets by name, or None: what the egress broker asks."""


class SecretBox:
    """Seals and opens values with the key derived from ``REPLGATE_SECRETS_KEY``."""

    def __init__(self, setting: SecretStr) -> None:
        master = decode_secrets_key(setting.get_secret_value())
        key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                   info=b"replgate secrets v1").derive(master)
        self._aead = AESGCM(key)

    def __repr__(self) -> str:
        return "<SecretBox>"

    @staticmethod
    def _bound(tenant: str, name: str) -> bytes:
        return f"{tenant}\0{name}".encode()

    def seal(self, tenant: str, name: str, value: str) -> str:
        """The text stored for ``value``: version, then base64 of nonce and ciphertext."""
        nonce = os.urandom(_NONCE)
        sealed = self._aead.encrypt(nonce, value.encode(), self._bound(tenant, name))
        return _FORMAT + base64.b64encode(nonce + sealed).decode()

    def open(self, tenant: str, name: str, sealed: str) -> str:
        """The value ``sealed`` holds; ValueError if it does not open (another key, tenant or
        name, or tampered)."""
        try:
            if not sealed.startswith(_FORMAT):
                raise ValueError("unknown format")
            raw = base64.b64decode(sealed[len(_FORMAT):], validate=True)
            plain = self._aead.decrypt(raw[:_NONCE], raw[_NONCE:], self._bound(tenant, name))
        except (InvalidTag, binascii.Error, ValueError):
            raise ValueError(f"secret {name!r} does not open with REPLGATE_SECRETS_KEY "
                             "(another key sealed it, or it was changed)") from None
        return plain.decode()


def check_name(name: str) -> None:
    """InvalidInput unless ``name`` is a valid secret name."""
    if not NAME_PATTERN.fullmatch(name):
        raise InvalidInput("a secret's name is 1 to 64 letters, digits, '_', '.' or '-', "
                           "starting with a letter, digit or '_'")


def check_value(value: str) -> None:
    """InvalidInput (naming no byte of it) unless ``value`` can travel in an HTTP header."""
    if not value:
        raise InvalidInput("a secret's value must not be empty")
    if len(value.encode()) > MAX_VALUE_BYTES:
        raise InvalidInput(f"a secret's value must be at most {MAX_VALUE_BYTES} bytes")
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in value):
        raise InvalidInput("a secret's value must not hold control characters (CR, LF, NUL, "
                           "tab ...): it is sent in HTTP headers")
    if any(ord(char) > 0xFF for char in value):
        raise InvalidInput("a secret's value must be Latin-1 text (HTTP header values are)")


class Secrets:
    """The secrets API's use cases, over the store."""

    def __init__(self, store: Store, key: SecretStr | None) -> None:
        self._store = store
        self._box = SecretBox(key) if key is not None else None

    def __repr__(self) -> str:
        return f"<Secrets {'enabled' if self._box else 'disabled: no REPLGATE_SECRETS_KEY'}>"

    @property
    def enabled(self) -> bool:
        """Whether ``REPLGATE_SECRETS_KEY`` is set (else secrets cannot be stored)."""
        return self._box is not None

    def _require_box(self) -> SecretBox:
        if self._box is None:
            raise Conflict("secrets are not enabled on this gateway: the operator sets "
                           "REPLGATE_SECRETS_KEY (base64 of 32 random bytes) to keep them "
                           "encrypted at rest")
        return self._box

    async def put(self, tenant: str, name: str, value: str) -> None:
        """Store the tenant's secret, replacing the value of one of that name."""
        check_name(name)
        check_value(value)
        await self._store.put_secret(tenant, name, self._require_box().seal(tenant, name, value))

    async def create(self, tenant: str, name: str, value: str,
                     metadata: dict[str, str]) -> SecretRecord:
        """Store a new secret (version 1); Conflict if the tenant has one of that name."""
        check_name(name)
        check_value(value)
        sealed = self._require_box().seal(tenant, name, value)
        if not await self._store.add_secret(tenant, name, sealed, metadata):
            raise Conflict(f"a secret named {name!r} exists: update it, or delete it first")
        return await self._record(tenant, name)

    async def update(self, tenant: str, name: str, value: str,
                     metadata: dict[str, str] | None) -> SecretRecord:
        """Replace an existing secret's value (one more version) and, unless None, its
        metadata; NotFound if there is none of that name."""
        check_name(name)
        check_value(value)
        sealed = self._require_box().seal(tenant, name, value)
        if not await self._store.replace_secret(tenant, name, sealed, metadata):
            raise NotFound(f"no secret named {name!r}")
        return await self._record(tenant, name)

    async def info(self, tenant: str, name: str) -> SecretRecord | None:
        """The tenant's secret of that name (never its value), or None."""
        return await self._store.secret_record(tenant, name)

    async def _record(self, tenant: str, name: str) -> SecretRecord:
        record = await self._store.secret_record(tenant, name)
        if record is None:  # deleted meanwhile, by another request
            raise NotFound(f"no secret named {name!r}")
        return record

    async def list(self, tenant: str) -> list[SecretRecord]:
        """The tenant's secrets' names and times."""
        return await self._store.list_secrets(tenant)

    async def delete(self, tenant: str, name: str) -> None:
        """Remove the tenant's secret; NotFound if there is none of that name."""
        check_name(name)
        if not await self._store.delete_secret(tenant, name):
            raise NotFound(f"no secret named {name!r}")

    async def value(self, tenant: str, name: str) -> str | None:
        """The value of the tenant's secret, or None: for the egress broker only."""
        sealed = await self._store.sealed_secret(tenant, name)
        if sealed is None:
            return None
        return self._require_box().open(tenant, name, sealed)

    def lookup_for(self, tenant: str, session_id: str | None = None) -> SecretLookup:
        """What a session's egress broker asks for a secret's value: read at each request, so
        a replaced value applies to the next request and a deleted one is refused. (The
        session's rules already bound which names its broker asks for.)"""

        async def lookup(name: str) -> str | None:
            return await self.value(tenant, name)

        return lookup
