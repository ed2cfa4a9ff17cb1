"""The bundle store's interface: objects by key, streamed in and out in bounded chunks.

A :class:`BundleStore` never holds a whole object in memory. A write goes through
:meth:`BundleStore.writer` and becomes visible only when its block ends without an error: a
write that fails or is cancelled leaves nothing under the key (and the previous object, if
any, in place). Keys are ``/``-separated paths of safe segments (:func:`check_key`).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator
from contextlib import AbstractAsyncContextManager
from typing import Protocol

PART_SIZE = 8 * 1024 * 1024
"""Bytes per chunk read, and per part of a multipart upload: what one stream holds at most."""

_SEGMENT = re.compile(r"[A-Za-z0-9_~%-][A-Za-z0-9._~%-]*")


def check_key(key: str) -> str:
    """``key`` if every segment is safe in a path and an S3 key, else :class:`ValueError`."""
    if not all(_SEGMENT.fullmatch(part) for part in key.split("/")):
        raise ValueError(f"invalid bundle store key {key!r}")
    return key


class ObjectWriter(Protocol):
    """What :meth:`BundleStore.writer` yields: the object's bytes, chunk after chunk."""

    async def write(self, chunk: bytes) -> None:
        """Append ``chunk``; waits while the store is behind, so memory stays bounded."""


class BundleStore(ABC):
    """Objects by key in a shared place (``file://`` or ``s3://``), streamed both ways."""

    url: str
    """Where the objects live, as configured (no credentials in it)."""

    @abstractmethod
    def writer(self, key: str) -> AbstractAsyncContextManager[ObjectWriter]:
        """Write the object ``key``: committed atomically when the block exits cleanly,
        nothing visible when it raises or is cancelled."""

    @abstractmethod
    def reader(self, key: str) -> AsyncGenerator[bytes, None]:
        """The object's bytes in chunks of at most about :data:`PART_SIZE`;
        :class:`~kernel_pool.bundles.BundleNotFound` if there is none."""

    @abstractmethod
    async def exists(self, key: str) -> bool:
        """Whether an object is committed under ``key``."""

    @abstractmethod
    async def delete(self, key: str) -> None:
        """Remove the object ``key``; no error when there is none."""

    @abstractmethod
    async def list(self, prefix: str) -> list[str]:
        """The keys of the committed objects under ``prefix`` (a folder: ``a/b`` lists ``a/b/...``),
        sorted."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"

