"""Bundles sealed per tenant and checked on the way back: a changed, cut or misplaced object,
or another key, is refused, never restored."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from seaweed_support import put_bundle
from tink import cleartext_keyset_handle, streaming_aead
from tink.proto import aes_gcm_hkdf_streaming_pb2, common_pb2, tink_pb2

from kernel_pool.bundles import BundleCorrupt, BundleKeys, Bundles, BundleStore, open_store
from kernel_pool.bundles._crypto import SEGMENT_SIZE, Opener, Sealer

KEYS = BundleKeys(os.urandom(32))
PART = os.urandom(3 * SEGMENT_SIZE + 1000)


async def _read(bundles: Bundles, tenant: str, session: str, part: str = "snapshot") -> bytes:
    bundle = await bundles.open(tenant, session)
    return b"".join([chunk async for chunk in bundle.read(part)])


async def _object(store: BundleStore, key: str) -> bytes:
    return b"".join([chunk async for chunk in store.reader(key)])


async def _replace(store: BundleStore, key: str, content: bytes) -> None:
    async with store.writer(key) as out:
        await out.write(content)


async def _part_key(bundles: Bundles, tenant: str, session: str) -> str:
    [key] = [key for key in await bundles.store.list(bundles.folder(tenant, session))
             if key.endswith("/snapshot")]
    return key


@pytest.mark.parametrize("where", ["file-sealed", "file-clear", "s3-sealed"])
@pytest.mark.parametrize("damage", ["flip", "truncate", "drop-last-segment", "extend"])
async def test_a_damaged_part_is_refused(where: str, damage: str, tmp_path: Path,
                                         request: pytest.FixtureRequest) -> None:
    # in the clear (no key) is for file:// only; there the manifest's hashes refuse it
    store_url = (tmp_path / "b").as_uri() if where.startswith("file") else str(
        request.getfixturevalue("s3_url"))
    keys = None if where == "file-clear" else KEYS
    bundles = Bundles(open_store(store_url), keys)
    await put_bundle(bundles, "acme", "s1", {"snapshot": PART})
    assert await _read(bundles, "acme", "s1") == PART
    key = await _part_key(bundles, "acme", "s1")
    stored = bytearray(await _object(bundles.store, key))
    if damage == "flip":
        stored[len(stored) // 2] ^= 1
    elif damage == "truncate":
        del stored[-100:]
    elif damage == "drop-last-segment":
        del stored[len(stored) - (len(stored) - 40) % SEGMENT_SIZE:]
    else:
        stored += b"more"
    await _replace(bundles.store, key, bytes(stored))
    with pytest.raises(BundleCorrupt, match="refused and not restored"):
        await _read(bundles, "acme", "s1")


async def test_another_tenants_key_or_master_key_is_refused(store_url: str) -> None:
    bundles = Bundles(open_store(store_url), KEYS)
    await put_bundle(bundles, "acme", "s1", {"snapshot": PART})
    # the same objects put where the other tenant's session would have them
    for key in await bundles.store.list("acme/s1"):
        await _replace(bundles.store, key.replace("acme/", "evil/", 1),
                       await _object(bundles.store, key))
    with pytest.raises(BundleCorrupt, match="manifest does not open"):
        await bundles.open("evil", "s1")
    stranger = Bundles(bundles.store, BundleKeys(os.urandom(32)))
    with pytest.raises(BundleCorrupt, match="manifest does not open"):
        await stranger.open("acme", "s1")
    unkeyed = Bundles(bundles.store, None)
    with pytest.raises(BundleCorrupt, match="set REPLGATE_BUNDLE_KEY"):
        await unkeyed.open("acme", "s1")


async def test_a_part_moved_to_another_name_is_refused(tmp_path: Path) -> None:
    bundles = Bundles(open_store((tmp_path / "b").as_uri()), KEYS)
    await put_bundle(bundles, "acme", "s1", {"snapshot": PART, "workspace": b"w" * 5000})
    key = await _part_key(bundles, "acme", "s1")
    workspace = key.replace("/snapshot", "/workspace")
    await _replace(bundles.store, workspace, await _object(bundles.store, key))
    bundle = await bundles.open("acme", "s1")
    with pytest.raises(BundleCorrupt):
        [chunk async for chunk in bundle.read("workspace")]


def _tink(key: bytes) -> streaming_aead.StreamingAead:
    """Google Tink's own AES256_GCM_HKDF_1MB primitive on the same key value."""
    streaming_aead.register()
    params = aes_gcm_hkdf_streaming_pb2.AesGcmHkdfStreamingParams(
        ciphertext_segment_size=SEGMENT_SIZE, derived_key_size=32,
        hkdf_hash_type=common_pb2.SHA256)
    value = aes_gcm_hkdf_streaming_pb2.AesGcmHkdfStreamingKey(version=0, params=params,
                                                              key_value=key)
    keyset = tink_pb2.Keyset(primary_key_id=1, key=[tink_pb2.Keyset.Key(
        key_data=tink_pb2.KeyData(
            type_url="type.googleapis.com/google.crypto.tink.AesGcmHkdfStreamingKey",
            value=value.SerializeToString(), key_material_type=tink_pb2.KeyData.SYMMETRIC),
        status=tink_pb2.ENABLED, key_id=1, output_prefix_type=tink_pb2.RAW)])
    primitive: streaming_aead.StreamingAead = cleartext_keyset_handle.from_keyset(
        keyset).primitive(streaming_aead.StreamingAead)
    return primitive


class _Kept(io.BytesIO):
    """A destination whose bytes outlive the close Tink's stream does on it."""

    kept = b""

    def close(self) -> None:
        self.kept = self.getvalue()
        super().close()


@pytest.mark.parametrize("size", [0, 1, SEGMENT_SIZE - 56, SEGMENT_SIZE - 55,
                                  SEGMENT_SIZE - 16, 2 * SEGMENT_SIZE + 7])
def test_sealing_is_tinks_streaming_aead_both_ways(size: int) -> None:
    key, aad, plain = os.urandom(32), b"replgate bundle v1\0acme/s1/manifest", os.urandom(size)
    tink = _tink(key)
    sealer = Sealer(key, aad)
    sealed = b"".join([*sealer.update(plain[:100]), *sealer.update(plain[100:]),
                       *sealer.finish()])
    with tink.new_decrypting_stream(io.BytesIO(sealed), aad) as stream:
        assert stream.read() == plain
    destination = _Kept()
    with tink.new_encrypting_stream(destination, aad) as stream:
        stream.write(plain)
    opener = Opener(key, aad)
    half = len(destination.kept) // 2
    opened = b"".join([*opener.update(destination.kept[:half]),
                       *opener.update(destination.kept[half:])]) + opener.finish()
    assert opened == plain
