"""Bundles sealed per tenant: Tink's AES-GCM-HKDF streaming AEAD, on cryptography's primitives.

The format is Google Tink's published one (developers.google.com/tink/streaming-aead/
aes_gcm_hkdf_streaming; the STREAM construction of Hoang, Reyhanitabar, Rogaway and Vizár),
with the parameters of Tink's ``AES256_GCM_HKDF_1MB`` template: a 40-byte header (its length,
a random 32-byte salt, a random 7-byte nonce prefix), a key derived for this ciphertext by
HKDF-SHA256 from the tenant's key, the salt and the associated data, then 1 MiB segments, each
sealed by AES-256-GCM under the nonce ``prefix || segment index || last-segment flag``.
A segment changed, moved, dropped or added, a stream cut short, another tenant's key or
another object's associated data: each makes a segment fail its tag, and the reader stops
there. ``tests/kernel_pool/bundles/test_sealing.py`` checks the bytes against Tink itself.

Tenants' keys are derived from one master key (``REPLGATE_BUNDLE_KEY``) by HKDF-SHA256, so a
node needs one secret, and no tenant's key opens another's bundles.
"""

from __future__ import annotations

import hashlib
import os
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from kernel_pool.config import check_bundle_key, decode_bundle_key

SEGMENT_SIZE = 1 << 20
"""Bytes of one ciphertext segment (Tink's ``AES256_GCM_HKDF_1MB``)."""
KEY_SIZE = 32
_NONCE_PREFIX_SIZE = 7
HEADER_SIZE = 1 + KEY_SIZE + _NONCE_PREFIX_SIZE
_TAG_SIZE = 16


class SealError(Exception):
    """A sealed stream that does not open: tampered, truncated, or another key's."""


def _hkdf(key: bytes, salt: bytes | None, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=KEY_SIZE, salt=salt, info=info).derive(key)


class BundleKeys:
    """The master key, and the per-tenant keys derived from it."""

    def __init__(self, master: bytes) -> None:
        check_bundle_key(master)
        self._master = master
        self.key_id = hashlib.sha256(b"replgate bundle key id\0" + master).hexdigest()[:16]
        """Names the master key in manifests without revealing it, so a node holding another
        key says so instead of failing on every segment."""

    @classmethod
    def from_setting(cls, value: str) -> BundleKeys:
        """From ``REPLGATE_BUNDLE_KEY``: 32 or more random bytes, base64-encoded."""
        return cls(decode_bundle_key(value))

    def tenant_key(self, tenant: str) -> bytes:
        """The key that seals ``tenant``'s bundles."""
        return _hkdf(self._master, None, b"replgate bundle tenant key\0" + tenant.encode())

    def __repr__(self) -> str:
        return f"<BundleKeys {self.key_id}>"


def _nonce(prefix: bytes, index: int, last: bool) -> bytes:
    return prefix + struct.pack(">I?", index, last)


class Sealer:
    """Encrypts one stream: feed plaintext to :meth:`update`, then :meth:`finish`.

    Holds at most one segment of plaintext between calls; what it returns is ciphertext to
    store, in order."""

    def __init__(self, key: bytes, associated_data: bytes) -> None:
        salt = os.urandom(KEY_SIZE)
        self._prefix = os.urandom(_NONCE_PREFIX_SIZE)
        self._aead = AESGCM(_hkdf(key, salt, associated_data))
        self._header: bytes | None = bytes([HEADER_SIZE]) + salt + self._prefix
        self._pending = bytearray()
        self._room = SEGMENT_SIZE - HEADER_SIZE - _TAG_SIZE
        self._index = 0

    def _seal(self, last: bool) -> bytes:
        sealed = self._aead.encrypt(_nonce(self._prefix, self._index, last), self._pending, None)
        self._index += 1
        self._pending.clear()
        self._room = SEGMENT_SIZE - _TAG_SIZE
        return sealed

    def _start(self) -> list[bytes]:
        header, self._header = self._header, None
        return [header] if header else []

    def update(self, data: bytes) -> list[bytes]:
        """Ciphertext for ``data``: whole segments, each sealed once it is known not to be
        the last."""
        out = self._start()
        view = memoryview(data)
        while view:
            if len(self._pending) == self._room:
                out.append(self._seal(last=False))
            take = self._room - len(self._pending)
            self._pending += view[:take]
            view = view[take:]
        return out

    def finish(self) -> list[bytes]:
        """The rest of the ciphertext: the last segment, flagged as last."""
        return [*self._start(), self._seal(last=True)]


class Opener:
    """Decrypts one stream sealed by :class:`Sealer`: feed ciphertext to :meth:`update`, then
    :meth:`finish`. Returns only plaintext whose segment's tag held; :class:`SealError` at
    the first that does not."""

    def __init__(self, key: bytes, associated_data: bytes) -> None:
        self._key = key
        self._associated_data = associated_data
        self._aead: AESGCM | None = None
        self._prefix = b""
        self._buffer = bytearray()
        self._size = SEGMENT_SIZE - HEADER_SIZE
        self._index = 0

    def _open(self, segment: memoryview | bytes, last: bool) -> bytes:
        assert self._aead is not None
        try:
            plain = self._aead.decrypt(_nonce(self._prefix, self._index, last), segment, None)
        except InvalidTag:
            raise SealError(f"segment {self._index} does not authenticate: the bundle was "
                            "changed or cut short, or sealed with another key") from None
        self._index += 1
        self._size = SEGMENT_SIZE
        return plain

    def update(self, data: bytes) -> list[bytes]:
        """Plaintext of the segments ``data`` completes, but the one that may be the last."""
        self._buffer += data
        start = 0
        if self._aead is None:
            if len(self._buffer) < HEADER_SIZE:
                return []
            if self._buffer[0] != HEADER_SIZE:
                raise SealError("its header is not that of a sealed bundle")
            salt = bytes(self._buffer[1:1 + KEY_SIZE])
            self._prefix = bytes(self._buffer[1 + KEY_SIZE:HEADER_SIZE])
            self._aead = AESGCM(_hkdf(self._key, salt, self._associated_data))
            start = HEADER_SIZE
        out = []
        view = memoryview(self._buffer)
        # a segment followed by more bytes is not the last one
        while len(self._buffer) - start > (size := self._size):
            out.append(self._open(view[start:start + size], last=False))
            start += size
        view.release()
        del self._buffer[:start]
        return out

    def finish(self) -> bytes:
        """The last segment's plaintext; :class:`SealError` if the stream ended early."""
        if self._aead is None or len(self._buffer) < _TAG_SIZE:
            raise SealError("it ends before its first segment does")
        return self._open(bytes(self._buffer), last=True)
