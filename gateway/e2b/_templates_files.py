"""The files of E2B's ``copy`` steps: uploaded before a build, read by it.

E2B's SDK hashes each ``copy`` step's files, asks ``GET /templates/{id}/files/{hash}`` whether
they are there, and if not PUTs a tar of them to the URL answered, without its API key (that
URL is S3's, presigned, on E2B). Here the URL is the gateway's own
(``PUT /e2b/templates/uploads/{hash}``), signed: it names the tenant, the hash and an expiry,
MAC'd with the E2B face's key, so it lets its holder put those files for that tenant only,
for an hour. Archives are kept per tenant under the state directory
(``e2b-uploads/<tenant's digest>/<hash>.tar``), at most :data:`UPLOAD_MAX` bytes each, so a
hash uploaded once is ``present`` for that tenant's later builds. With a bundle store
(``REPLGATE_BUNDLE_STORE``) each archive is also put there (same key), so another gateway, or
this one after its state directory is gone, finds it and fetches it before a build reads it.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from urllib.parse import urlencode

import anyio
from anyio import AsyncFile
from fastapi import Request

from gateway.e2b._errors import E2BError
from kernel_pool import PART_SIZE, BundleStore

UPLOAD_MAX = 256 << 20
"""The largest archive one ``copy`` step may upload (bytes)."""
URL_TTL_S = 3600
"""How long an upload URL is good for (E2B's SDK uploads at once; its timeout is an hour)."""
_HASH = re.compile(r"[0-9a-f]{64}")


def check_hash(files_hash: str) -> str:
    """E2B's files hash (a SHA-256 in hex), or E2B's 400."""
    if not _HASH.fullmatch(files_hash):
        raise E2BError(400, f"a files hash is 64 lower-case hex digits, not {files_hash!r}")
    return files_hash


class Uploads:
    """The uploaded archives of each tenant, and the signed URLs that put them."""

    def __init__(self, root: Path, sign: Callable[[str], str],
                 store: BundleStore | None = None) -> None:
        self.root = root
        self._sign = sign
        self.store = store
        """Where every gateway finds the archives (None: on this gateway only)."""

    def _mac(self, tenant: str, files_hash: str, expires: int) -> str:
        return self._sign(f"e2b-upload\n{tenant}\n{files_hash}\n{expires}")

    def path(self, tenant: str, files_hash: str) -> Path:
        digest = hashlib.sha256(tenant.encode()).hexdigest()[:32]
        return self.root / digest / f"{check_hash(files_hash)}.tar"

    def _key(self, tenant: str, files_hash: str) -> str:
        return "e2b-uploads/" + self.path(tenant, files_hash).relative_to(self.root).as_posix()

    async def present(self, tenant: str, files_hash: str) -> bool:
        if await anyio.Path(self.path(tenant, files_hash)).is_file():
            return True
        return self.store is not None and await self.store.exists(self._key(tenant, files_hash))

    async def fetch(self, tenant: str, files_hash: str) -> None:
        """Make the archive a file here (:meth:`path`) if only the bundle store has it."""
        final = self.path(tenant, files_hash)
        if self.store is None or await anyio.Path(final).is_file():
            return
        async with self._partial(final) as out, \
                aclosing(self.store.reader(self._key(tenant, files_hash))) as chunks:
            async for chunk in chunks:
                await out.write(chunk)

    def url(self, request: Request, tenant: str, files_hash: str) -> str:
        """A URL that puts ``files_hash``'s archive for ``tenant``, good for an hour."""
        expires = int(time.time()) + URL_TTL_S
        query = urlencode({"tenant": tenant, "expires": expires,
                           "signature": self._mac(tenant, files_hash, expires)})
        base = str(request.url_for("e2b_template_upload", files_hash=files_hash))
        return f"{base}?{query}"

    def check(self, tenant: str, files_hash: str, expires: int, signature: str) -> None:
        """E2B's 403 unless the URL was signed here, for this tenant and hash, and is good."""
        good = self._mac(tenant, check_hash(files_hash), expires)
        if not hmac.compare_digest(signature, good):
            raise E2BError(403, "this upload URL was not made for these files: ask "
                                "GET /templates/{id}/files/{hash} for one")
        if expires < time.time():
            raise E2BError(403, "this upload URL has expired: ask GET "
                                "/templates/{id}/files/{hash} for another")

    async def receive(self, request: Request, tenant: str, files_hash: str) -> int:
        """Keep the request's body as the archive of ``files_hash``; E2B's 413 past
        :data:`UPLOAD_MAX` (nothing is kept then). Returns its size."""
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > UPLOAD_MAX:
            raise _too_large()
        final = self.path(tenant, files_hash)
        size = 0
        async with self._partial(final) as out:
            async for chunk in request.stream():
                size += len(chunk)
                if size > UPLOAD_MAX:
                    raise _too_large()
                await out.write(chunk)
        if self.store is not None:  # (a failed put raises: the SDK's upload fails, and retries)
            async with self.store.writer(self._key(tenant, files_hash)) as put, \
                    await anyio.open_file(final, "rb") as read:
                while chunk := await read.read(PART_SIZE):
                    await put.write(chunk)
        return size

    @asynccontextmanager
    async def _partial(self, final: Path) -> AsyncIterator[AsyncFile[bytes]]:
        """A file written beside ``final`` and renamed to it when the block ends cleanly."""
        await anyio.Path(final.parent).mkdir(parents=True, exist_ok=True)
        partial = final.with_name(f"{final.name}.{os.getpid()}.{time.monotonic_ns()}.part")
        try:
            async with await anyio.open_file(partial, "wb") as out:
                yield out
            await anyio.Path(partial).rename(final)
        finally:
            with contextlib.suppress(FileNotFoundError):
                await anyio.Path(partial).unlink()


def _too_large() -> E2BError:
    return E2BError(413, f"a copy step's files may be at most {UPLOAD_MAX >> 20} MiB "
                         "(compressed) on replgate")
