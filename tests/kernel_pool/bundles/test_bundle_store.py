"""The bundle store against a real S3 server (SeaweedFS) and a folder: streamed, bounded in
memory, atomic."""

from __future__ import annotations

import base64
import hashlib
import os

import anyio
import psutil
import pytest
from pydantic import ValidationError
from seaweed_support import INFO, SeaweedFS, put_bundle

from kernel_pool.bundles import (
    PART_SIZE,
    BundleKeys,
    BundleNotFound,
    Bundles,
    open_store,
)
from kernel_pool.config import BundleSettings

MIB = 1024 * 1024
KEYS = BundleKeys(os.urandom(32))



async def test_round_trip_of_200_mib_keeps_memory_bounded(store_url: str) -> None:
    bundles = Bundles(open_store(store_url), KEYS)
    process = psutil.Process()
    start = peak = process.memory_info().rss
    block = os.urandom(PART_SIZE)
    written = hashlib.sha256()
    size = 0
    async with bundles.write("acme", "s1", INFO) as writer:
        async with writer.part("snapshot") as part:
            for index in range(26):  # 208 MiB
                chunk = index.to_bytes(8) + block[8:]
                written.update(chunk)
                size += len(chunk)
                await part.write(chunk)
                peak = max(peak, process.memory_info().rss)
        async with writer.part("workspace") as part:
            await part.write(b"a file")
    assert size > 200 * MIB

    bundle = await bundles.open("acme", "s1")
    assert bundle.manifest.parts["snapshot"].size == size
    read = hashlib.sha256()
    count = 0
    async for chunk in bundle.read("snapshot"):
        read.update(chunk)
        count += len(chunk)
        peak = max(peak, process.memory_info().rss)
    assert (count, read.hexdigest()) == (size, written.hexdigest())
    assert [chunk async for chunk in bundle.read("workspace")] == [b"a file"]
    # a whole copy would be 208 MiB; a few parts in flight are what the store may hold
    assert peak - start < 96 * MIB, f"RSS grew by {(peak - start) / MIB:.0f} MiB"


async def test_cancelled_upload_leaves_no_object(store_url: str,
                                                 seaweedfs: SeaweedFS) -> None:
    store = open_store(store_url)
    before = seaweedfs.pending_uploads()
    with anyio.CancelScope() as scope:
        async with store.writer("a/object") as out:
            for _ in range(3):  # more than one part, so the S3 store began a multipart upload
                await out.write(os.urandom(PART_SIZE))
            scope.cancel()
            await anyio.sleep(1)
    assert scope.cancelled_caught
    assert not await store.exists("a/object")
    assert await store.list("a") == []
    assert seaweedfs.pending_uploads() == before


async def test_failed_write_leaves_the_previous_object(store_url: str) -> None:
    store = open_store(store_url)
    async with store.writer("a/object") as out:
        await out.write(b"first")
    with pytest.raises(RuntimeError, match="boom"):
        async with store.writer("a/object") as out:
            await out.write(os.urandom(2 * PART_SIZE))
            raise RuntimeError("boom")
    assert [chunk async for chunk in store.reader("a/object")] == [b"first"]
    assert await store.list("") == ["a/object"]


async def test_list_exists_and_delete(store_url: str) -> None:
    store = open_store(store_url)
    for key in ("t1/s1/manifest", "t1/s2/manifest", "t2/s1/manifest"):
        async with store.writer(key) as out:
            await out.write(key.encode())
    assert await store.list("t1") == ["t1/s1/manifest", "t1/s2/manifest"]
    assert await store.exists("t2/s1/manifest")
    await store.delete("t1/s1/manifest")
    await store.delete("t1/s1/manifest")  # a second delete is not an error
    assert not await store.exists("t1/s1/manifest")
    assert await store.list("") == ["t1/s2/manifest", "t2/s1/manifest"]
    with pytest.raises(BundleNotFound):
        [chunk async for chunk in store.reader("t1/s1/manifest")]


async def test_bundles_list_and_delete_by_session(store_url: str) -> None:
    bundles = Bundles(open_store(store_url), KEYS)
    for session in ("s1", "s2"):
        await put_bundle(bundles, "acme", session, {"snapshot": session.encode()})
    await put_bundle(bundles, "other tenant", "s3", {"snapshot": b"x"})
    assert await bundles.list("acme") == ["s1", "s2"]
    assert await bundles.list("other tenant") == ["s3"]
    await bundles.delete("acme", "s1")
    assert await bundles.list("acme") == ["s2"]
    assert not await bundles.exists("acme", "s1")
    with pytest.raises(BundleNotFound):
        await bundles.open("acme", "s1")
    assert await bundles.store.list("acme/s1") == []


async def test_a_new_bundle_replaces_the_old_and_a_failed_one_keeps_it(store_url: str) -> None:
    bundles = Bundles(open_store(store_url), KEYS)
    for content in (b"old", b"new"):
        await put_bundle(bundles, "acme", "s1", {"snapshot": content})
    with pytest.raises(RuntimeError):
        async with bundles.write("acme", "s1", INFO) as writer:
            async with writer.part("snapshot") as part:
                await part.write(b"never committed")
            raise RuntimeError("the pause failed")
    bundle = await bundles.open("acme", "s1")
    assert [chunk async for chunk in bundle.read("snapshot")] == [b"new"]
    # one generation's part and the manifest: nothing of the old or the failed write
    assert len(await bundles.store.list("acme/s1")) == 2


def test_s3_without_a_key_is_refused_with_the_setting_named() -> None:
    with pytest.raises(ValidationError, match="REPLGATE_BUNDLE_KEY is unset"):
        BundleSettings(store="s3://bucket/prefix")
    with pytest.raises(ValidationError, match="s3://bucket/prefix or file:///path"):
        BundleSettings(store="ftp://elsewhere")
    with pytest.raises(ValidationError, match="not base64"):
        BundleSettings(store="file:///srv/bundles", key="not a key!")
    key = base64.b64encode(os.urandom(32)).decode()
    assert Bundles.from_settings(BundleSettings(store="s3://bucket/prefix", key=key))
    assert Bundles.from_settings(BundleSettings()) is None
