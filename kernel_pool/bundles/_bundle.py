"""Paused sessions as bundles in a :class:`BundleStore`: parts (the snapshot, the workspace...)
streamed in, sealed with the tenant's key, committed by a manifest written last.

Layout, per session: ``<tenant>/<session>/manifest`` and ``<tenant>/<session>/<generation>/
<part>``. A write puts its parts in a new generation folder, then the manifest naming them,
then removes older generations: a failed or cancelled write leaves the previous bundle whole,
and removes what it wrote. Each object is sealed with its own key path as associated data, so
an object moved to another session, tenant or part does not open.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote

import anyio
import anyio.to_thread
from pydantic import ValidationError

from kernel_pool.bundles._crypto import BundleKeys, Opener, Sealer, SealError
from kernel_pool.bundles._errors import BundleCorrupt, BundleNotFound, BundleStoreError
from kernel_pool.bundles._manifest import BundleInfo, Manifest, Part
from kernel_pool.bundles._open import open_store
from kernel_pool.bundles._store import BundleStore, ObjectWriter

if TYPE_CHECKING:
    from kernel_pool.config import BundleSettings

_MANIFEST = "manifest"
_MANIFEST_MAX = 1 << 20
"""A manifest is a few hundred bytes; a larger object there is not one, and is not read."""


class _Clear:
    """No key (``file://`` without ``REPLGATE_BUNDLE_KEY``): bytes as they are; the manifest's
    hashes still refuse a changed or truncated part."""

    def update(self, data: bytes) -> list[bytes]:
        return [data]

    def finish(self) -> list[bytes]:
        return []


def _segment(name: str) -> str:
    if not name or name in {".", ".."}:
        raise ValueError(f"invalid bundle name {name!r}")
    return quote(name, safe="")


def _aad(key: str) -> bytes:
    return b"replgate bundle v1\0" + key.encode()


class _PartWriter:
    def __init__(self, out: ObjectWriter, cipher: Sealer | _Clear) -> None:
        self._out = out
        self._cipher = cipher
        self.hash = hashlib.sha256()
        self.size = 0

    def _take(self, chunk: bytes) -> list[bytes]:
        self.hash.update(chunk)
        return self._cipher.update(chunk)

    async def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        for sealed in await anyio.to_thread.run_sync(self._take, chunk):
            await self._out.write(sealed)

    async def finish(self) -> Part:
        for sealed in self._cipher.finish():
            await self._out.write(sealed)
        return Part(size=self.size, sha256=self.hash.hexdigest())


class BundleWriter:
    """One bundle being written: :meth:`part` for each part, in any order, one at a time."""

    def __init__(self, bundles: Bundles, tenant: str, session_id: str) -> None:
        self._bundles = bundles
        self._tenant = tenant
        self._session_id = session_id
        self.generation = secrets.token_hex(8)
        self._folder = f"{bundles.folder(tenant, session_id)}/{self.generation}"
        self.parts: dict[str, Part] = {}
        self.written: list[str] = []

    @asynccontextmanager
    async def part(self, name: str) -> AsyncIterator[ObjectWriter]:
        """Stream the part ``name`` in: ``await writer.write(chunk)`` for each chunk."""
        key = f"{self._folder}/{_segment(name)}"
        async with self._bundles.store.writer(key) as out:
            self.written.append(key)
            writer = _PartWriter(out, self._bundles.sealer(self._tenant, key))
            yield writer
            self.parts[name] = await writer.finish()


class Bundle:
    """A committed bundle, its manifest read and checked; :meth:`read` streams a part."""

    def __init__(self, bundles: Bundles, manifest: Manifest, folder: str) -> None:
        self._bundles = bundles
        self.manifest = manifest
        self._folder = folder

    async def read(self, name: str) -> AsyncGenerator[bytes, None]:
        """The part's bytes, in chunks. Each is authenticated before it is yielded; the last
        only once the whole part's size and hash are checked, so a caller that restores into
        a place of its own and keeps it only when this ends without error never restores a
        changed or truncated part (:class:`BundleCorrupt` says which)."""
        part = self.manifest.parts.get(name)
        key = f"{self._folder}/{self.manifest.generation}/{_segment(name)}"
        if part is None:
            raise BundleNotFound(key)
        opener = self._bundles.opener(self.manifest.tenant, key)
        digest = hashlib.sha256()
        size = 0

        def take(chunk: bytes) -> list[bytes]:
            plain = opener.update(chunk)
            for piece in plain:
                digest.update(piece)
            return plain

        try:
            async with aclosing(self._bundles.store.reader(key)) as chunks:
                async for chunk in chunks:
                    for piece in await anyio.to_thread.run_sync(take, chunk):
                        size += len(piece)
                        if size > part.size:
                            raise BundleCorrupt(key, f"longer than the {part.size} bytes its "
                                                "manifest states")
                        yield piece
            last = opener.finish() if isinstance(opener, Opener) else b""
        except SealError as exc:
            raise BundleCorrupt(key, str(exc)) from None
        digest.update(last)
        size += len(last)
        if size != part.size or digest.hexdigest() != part.sha256:
            raise BundleCorrupt(key, f"{size} bytes read back, not the {part.size} bytes of "
                                "its manifest, or not the same bytes")
        if last:
            yield last


class _ClearOpener:
    def update(self, data: bytes) -> list[bytes]:
        return [data]


class Bundles:
    """Paused sessions' bundles in ``store``, sealed with ``keys`` (``None``: in the clear,
    for a ``file://`` store only)."""

    def __init__(self, store: BundleStore, keys: BundleKeys | None) -> None:
        self.store = store
        self.keys = keys

    @classmethod
    def from_settings(cls, settings: BundleSettings) -> Bundles | None:
        """The bundles ``settings`` configure; ``None`` when no store is set."""
        if settings.store is None:
            return None
        key = settings.key.get_secret_value() if settings.key else None
        return cls(open_store(settings.store), BundleKeys.from_setting(key) if key else None)

    def __repr__(self) -> str:
        return f"<Bundles {self.store.url} {'sealed' if self.keys else 'in the clear'}>"

    def folder(self, tenant: str, session_id: str) -> str:
        """The key folder of one session's bundle."""
        return f"{_segment(tenant)}/{_segment(session_id)}"

    def sealer(self, tenant: str, key: str) -> Sealer | _Clear:
        """What seals the object ``key`` of ``tenant``."""
        if self.keys is None:
            return _Clear()
        return Sealer(self.keys.tenant_key(tenant), _aad(key))

    def opener(self, tenant: str, key: str) -> Opener | _ClearOpener:
        """What opens the object ``key`` of ``tenant``."""
        if self.keys is None:
            return _ClearOpener()
        return Opener(self.keys.tenant_key(tenant), _aad(key))

    @asynccontextmanager
    async def write(self, tenant: str, session_id: str,
                    info: BundleInfo) -> AsyncIterator[BundleWriter]:
        """Write the bundle of ``session_id``: its parts inside the block, committed (replacing
        the previous bundle) when the block ends without error."""
        writer = BundleWriter(self, tenant, session_id)
        folder = self.folder(tenant, session_id)
        try:
            yield writer
            manifest = Manifest(
                **info.model_dump(), tenant=tenant, session_id=session_id,
                generation=writer.generation, created_at=datetime.now(UTC),
                sealed=self.keys is not None, parts=writer.parts)
            key = f"{folder}/{_MANIFEST}"
            async with self.store.writer(key) as out:
                part = _PartWriter(out, self.sealer(tenant, key))
                await part.write(manifest.model_dump_json().encode())
                await part.finish()
        except BaseException:
            # what is left (the store down) goes with the next write's older generations
            with anyio.CancelScope(shield=True), contextlib.suppress(BundleStoreError):
                for key in writer.written:
                    await self.store.delete(key)
            raise
        # older generations are garbage once the manifest names this one
        for key in await self.store.list(folder):
            if not key.startswith(f"{folder}/{writer.generation}/") and key != (
                    f"{folder}/{_MANIFEST}"):
                await self.store.delete(key)

    async def open(self, tenant: str, session_id: str) -> Bundle:
        """The committed bundle of ``session_id``, its manifest authenticated and checked;
        :class:`BundleNotFound` if there is none."""
        folder = self.folder(tenant, session_id)
        key = f"{folder}/{_MANIFEST}"
        opener = self.opener(tenant, key)
        raw = bytearray()
        try:
            async with aclosing(self.store.reader(key)) as chunks:
                async for chunk in chunks:
                    raw += b"".join(opener.update(chunk))
                    if len(raw) > _MANIFEST_MAX:
                        raise BundleCorrupt(key, "its manifest is too large to be one")
            if isinstance(opener, Opener):
                raw += opener.finish()
        except SealError as exc:
            raise BundleCorrupt(key, f"its manifest does not open: {exc}") from None
        try:
            manifest = Manifest.model_validate_json(raw)
        except ValidationError:
            hint = "" if self.keys else " (a sealed bundle? set REPLGATE_BUNDLE_KEY)"
            raise BundleCorrupt(key, f"its manifest is not one{hint}") from None
        if (manifest.tenant, manifest.session_id) != (tenant, session_id):
            raise BundleCorrupt(key, "its manifest names another session")
        if manifest.sealed != (self.keys is not None):
            raise BundleCorrupt(key, "it was written sealed and is read in the clear, or "
                                "the other way round")
        return Bundle(self, manifest, folder)

    async def exists(self, tenant: str, session_id: str) -> bool:
        """Whether ``session_id`` has a committed bundle."""
        return await self.store.exists(f"{self.folder(tenant, session_id)}/{_MANIFEST}")

    async def delete(self, tenant: str, session_id: str) -> None:
        """Remove the bundle of ``session_id``, its manifest first, so no half is readable."""
        folder = self.folder(tenant, session_id)
        await self.store.delete(f"{folder}/{_MANIFEST}")
        for key in await self.store.list(folder):
            await self.store.delete(key)

    async def list(self, tenant: str) -> list[str]:
        """The sessions of ``tenant`` with a committed bundle."""
        prefix = _segment(tenant)
        return sorted(unquote(key.split("/")[1]) for key in await self.store.list(prefix)
                      if key.count("/") == 2 and key.endswith(f"/{_MANIFEST}"))
