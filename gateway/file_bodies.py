"""Files' bodies over HTTP: an upload read under its size cap, and gzip both ways.

An upload sent with ``Content-Encoding: gzip`` is inflated as it arrives and the cap applies
to what it inflates to: a small body that would inflate past it (a gzip bomb) is refused (413)
as soon as it gets there, having held no more than the cap. A download is gzipped when the
client's ``Accept-Encoding`` takes gzip (E2B's ``files.read(..., gzip=True)`` asks so).
"""

from __future__ import annotations

import functools
import gzip
import zlib

import anyio.to_thread
from fastapi import Request, Response

from common.errors import InvalidInput
from gateway.service import upload_too_large

GZIP_LEVEL = 1
"""Speed over size: a download is compressed while its client waits, on a gateway whose CPU
serves every session; level 1 gives most of the gain on text at several times level 6's
speed."""
INLINE_BYTES = 64 * 1024
"""Below this, compressing or inflating on the event loop costs less than a thread's hop."""
_GZIP_WBITS = 16 + zlib.MAX_WBITS


async def read_upload(request: Request, limit: int) -> bytes:
    """The request's body, inflated if it is gzip; refused (413) as soon as it is known to be
    over ``limit`` bytes, and (400) for another ``Content-Encoding`` or a broken gzip body."""
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return await _read_plain(request, limit)
    if encoding in ("gzip", "x-gzip"):
        return await _read_gzip(request, limit)
    raise InvalidInput(f"Content-Encoding {encoding!r} is not accepted: send the body as it "
                       "is, or gzip it (Content-Encoding: gzip)")


async def _read_plain(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise upload_too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise upload_too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def _read_gzip(request: Request, limit: int) -> bytes:
    # Deflate's worst case (stored blocks) adds 5 bytes per 64 KiB, gzip 18 per member: a
    # body far over the cap cannot be a file under it, however it was compressed.
    sent_limit = limit + limit // 1000 + 4096
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > sent_limit:
        raise upload_too_large(limit)
    inflater, sent = Inflater(limit), 0
    async for chunk in request.stream():
        sent += len(chunk)
        if sent > sent_limit:
            raise upload_too_large(limit)
        if len(chunk) < INLINE_BYTES // 16:  # at most 64 KiB of output per 4 KiB in, inlined
            inflater.feed(chunk)
        else:
            await anyio.to_thread.run_sync(inflater.feed, chunk)
    return inflater.finish()


class Inflater:
    """A gzip stream (one member or several, as ``gzip.decompress`` takes) inflated piece by
    piece, holding at most ``limit`` bytes of output."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        self._member = zlib.decompressobj(_GZIP_WBITS)
        self._inside = False
        """A member has begun and not ended."""

    def feed(self, data: bytes) -> None:
        try:
            while data:
                self._inside = True
                out = self._member.decompress(data, self.limit - self._size + 1)
                self._size += len(out)
                if self._size > self.limit:
                    raise upload_too_large(self.limit)
                self._parts.append(out)
                if self._member.eof:
                    data = self._member.unused_data
                    self._member = zlib.decompressobj(_GZIP_WBITS)
                    self._inside = False
                else:
                    data = self._member.unconsumed_tail
        except zlib.error as exc:
            raise InvalidInput(f"the body is not valid gzip ({exc}); send it as gzip "
                               "compresses it, or without Content-Encoding") from None

    def finish(self) -> bytes:
        if self._inside:
            raise InvalidInput("the gzip body ends in the middle of its data: it was cut short")
        return b"".join(self._parts)


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` header takes gzip (named, or ``*``, without ``q=0``)."""
    for item in accept_encoding.lower().split(","):
        coding, _, params = item.partition(";")
        if coding.strip() in ("gzip", "x-gzip", "*"):
            quality = params.strip().removeprefix("q=").strip() if "q=" in params else "1"
            try:
                return float(quality) > 0
            except ValueError:
                return False
    return False


async def file_response(request: Request, data: bytes) -> Response:
    """A file's bytes as a response, gzipped when the client accepts it and its first
    64 KiB shrink by a tenth at least (an image or an archive is sent as it is: gzip would
    cost the gateway's CPU for nothing; the client reads either)."""
    headers = {"Vary": "Accept-Encoding"}
    if accepts_gzip(request.headers.get("accept-encoding", "")):
        compress = functools.partial(gzip.compress, compresslevel=GZIP_LEVEL, mtime=0)
        if len(data) < INLINE_BYTES:
            data, headers["Content-Encoding"] = compress(data), "gzip"
        elif len(compress(data[:INLINE_BYTES])) < INLINE_BYTES * 0.9:
            data = await anyio.to_thread.run_sync(compress, data)
            headers["Content-Encoding"] = "gzip"
    return Response(data, media_type="application/octet-stream", headers=headers)
