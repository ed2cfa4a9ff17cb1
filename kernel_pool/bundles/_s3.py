"""``s3://bucket/prefix``: bundles in S3 or an S3-compatible server, through obstore.

Credentials, region and endpoint come from the usual ``AWS_*`` variables (obstore reads them);
``AWS_ENDPOINT_URL`` names an S3-compatible server (SeaweedFS, MinIO, Ceph...). A write is a
multipart upload of :data:`~kernel_pool.bundles._store.PART_SIZE` parts, two in flight: the
object appears only when the upload completes, and a write that fails or is cancelled aborts
its upload, so no part is left behind to be billed.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import anyio
import obstore
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from obstore.store import S3Store as _ObjectStore

from kernel_pool.bundles._errors import BundleNotFound, BundleStoreError
from kernel_pool.bundles._store import PART_SIZE, BundleStore, ObjectWriter, check_key

if TYPE_CHECKING:
    from obstore.store import ClientConfig

_PARTS_IN_FLIGHT = 2
_ABORT_TIMEOUT_S = 30.0
"""How long a failed or cancelled write waits for its multipart upload to be aborted."""


class _Aborted(Exception):
    """Raised into obstore's upload so that it aborts the multipart upload, not completes it."""


@dataclass
class _Upload:
    aborted: bool = False
    error: BaseException | None = None
    done: anyio.Event = field(default_factory=anyio.Event)


class _S3Writer:
    def __init__(self, send: MemoryObjectSendStream[bytes], upload: _Upload, fail: str) -> None:
        self._send = send
        self._upload = upload
        self._fail = fail

    async def write(self, chunk: bytes) -> None:
        try:
            await self._send.send(chunk)
        except anyio.BrokenResourceError:
            # the upload stopped taking chunks: it failed, and says why once it is done
            await self._upload.done.wait()
            raise BundleStoreError(self._fail, str(self._upload.error)) from self._upload.error


class S3Store(BundleStore):
    """Objects under ``prefix`` in ``bucket``."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError(f"not an s3://bucket/prefix URL: {url!r}")
        self.url = url.rstrip("/")
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        # obstore refuses plain HTTP unless told; an endpoint given as http:// is that telling
        options: ClientConfig = {"allow_http": True} if endpoint and endpoint.startswith(
            "http://") else {}
        self._store = _ObjectStore(parts.netloc, prefix=parts.path.strip("/") or None,
                                   client_options=options)

    def _path(self, key: str) -> str:
        return check_key(key)

    @asynccontextmanager
    async def writer(self, key: str) -> AsyncIterator[ObjectWriter]:
        path = self._path(key)
        send, receive = anyio.create_memory_object_stream[bytes](1)
        upload = _Upload()
        failure: BaseException | None = None
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._upload, path, receive, upload)
            try:
                yield _S3Writer(send, upload, self.url)
            except BaseException as exc:
                upload.aborted = True
                send.close()
                with anyio.CancelScope(shield=True), anyio.move_on_after(_ABORT_TIMEOUT_S):
                    await upload.done.wait()
                # raised outside the task group, which would wrap it in an exception group
                failure = exc
            else:
                send.close()
                await upload.done.wait()
        if failure is not None:
            raise failure
        if upload.error is not None:
            raise BundleStoreError(self.url, f"cannot write {key}: {upload.error}") from (
                upload.error)

    async def _upload(self, path: str, receive: MemoryObjectReceiveStream[bytes],
                      upload: _Upload) -> None:
        async def chunks() -> AsyncIterator[bytes]:
            with receive:
                async for chunk in receive:
                    yield chunk
            if upload.aborted:
                raise _Aborted

        try:
            # shielded: a cancelled put would drop the upload half done, never aborted; the
            # writer ends it instead by closing the chunks with `aborted` set
            with anyio.CancelScope(shield=True):
                await obstore.put_async(self._store, path, chunks(), chunk_size=PART_SIZE,
                                        max_concurrency=_PARTS_IN_FLIGHT)
        except _Aborted:
            pass
        except Exception as exc:
            upload.error = exc
        finally:
            receive.close()
            upload.done.set()

    async def reader(self, key: str) -> AsyncGenerator[bytes, None]:
        path = self._path(key)
        try:
            result = await obstore.get_async(self._store, path)
            async for chunk in result.stream(min_chunk_size=PART_SIZE):
                yield bytes(chunk)
        except FileNotFoundError:
            raise BundleNotFound(key) from None
        except obstore.exceptions.BaseError as exc:
            raise BundleStoreError(self.url, f"cannot read {key}: {exc}") from exc

    async def exists(self, key: str) -> bool:
        try:
            await obstore.head_async(self._store, self._path(key))
        except FileNotFoundError:
            return False
        except obstore.exceptions.BaseError as exc:
            raise BundleStoreError(self.url, f"cannot look up {key}: {exc}") from exc
        return True

    async def delete(self, key: str) -> None:
        try:
            await obstore.delete_async(self._store, self._path(key))
        except FileNotFoundError:
            return
        except obstore.exceptions.BaseError as exc:
            raise BundleStoreError(self.url, f"cannot delete {key}: {exc}") from exc

    async def list(self, prefix: str) -> list[str]:
        keys: list[str] = []
        try:
            async for batch in obstore.list(self._store, self._path(prefix) if prefix else None):
                keys.extend(meta["path"] for meta in batch)
        except obstore.exceptions.BaseError as exc:
            raise BundleStoreError(self.url, f"cannot list {prefix}: {exc}") from exc
        return sorted(keys)
