"""The files of E2B's ``copy`` steps: uploaded before a build, read by it.

E2B's SDK hashes each ``copy`` step's files, asks ``GET /templates/{id}/files/{hash}`` whether
they are there, and if not PUTs a tar of them to the URL answered, without its API key (that
URL is S3's, presigned, on E2B). Here the URL is the gateway's own
(``PUT /e2b/templates/uploads/{hash}``), signed: it names the tenant, the hash and an expiry,
MAC'd with the E2B face's key, so it lets its holder put those files for that tenant only,
for an hour. Archives are kept per tenant under the state directory
(``e2b-uploads/<tenant's digest>/<hash>.tar``), at most :data:`UPLOAD_MAX` bytes each, so a
hash uploaded once is ``present`` for that tenant's later builds. They are on the gateway that
took them: with several gateways, a build must reach the one its files were put to.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlencode

import anyio
from fastapi import Request

from gateway.e2b._errors import E2BError

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

    def __init__(self, root: Path, sign: Callable[[str], str]) -> None:
        self.root = root
        self._sign = sign

    def _mac(self, tenant: str, files_hash: str, expires: int) -> str:
        return self._sign(f"e2b-upload\n{tenant}\n{files_hash}\n{expires}")

    def path(self, tenant: str, files_hash: str) -> Path:
        digest = hashlib.sha256(tenant.encode()).hexdigest()[:32]
        return self.root / digest / f"{check_hash(files_hash)}.tar"

    async def present(self, tenant: str, files_hash: str) -> bool:
        return await anyio.Path(self.path(tenant, files_hash)).is_file()

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
        await anyio.Path(final.parent).mkdir(parents=True, exist_ok=True)
        partial = final.with_name(f"{final.name}.{os.getpid()}.{time.monotonic_ns()}.part")
        size = 0
        try:
            async with await anyio.open_file(partial, "wb") as out:
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > UPLOAD_MAX:
                        raise _too_large()
                    await out.write(chunk)
            await anyio.Path(partial).rename(final)
        finally:
            with contextlib.suppress(FileNotFoundError):
                await anyio.Path(partial).unlink()
        return size


def _too_large() -> E2BError:
    return E2BError(413, f"a copy step's files may be at most {UPLOAD_MAX >> 20} MiB "
                         "(compressed) on replgate")
