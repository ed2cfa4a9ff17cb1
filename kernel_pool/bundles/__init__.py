"""Paused sessions in shared storage, so that any node can resume them (``docs/bundles.md``).

:class:`Bundles` writes and reads a session's bundle (parts and a manifest) in a
:class:`BundleStore` (``s3://`` or ``file://``, :func:`open_store`), streamed in bounded
chunks, sealed per tenant (:class:`BundleKeys`) and checked on the way back;
:func:`write_session` and :func:`read_session` keep a paused session there and restore it.
"""

from kernel_pool.bundles._bundle import Bundle, Bundles, BundleWriter
from kernel_pool.bundles._crypto import BundleKeys
from kernel_pool.bundles._errors import BundleCorrupt, BundleNotFound, BundleStoreError
from kernel_pool.bundles._file import FileStore
from kernel_pool.bundles._manifest import BundleInfo, Manifest, Part
from kernel_pool.bundles._open import open_store
from kernel_pool.bundles._s3 import S3Store
from kernel_pool.bundles._session import read_session, write_session
from kernel_pool.bundles._store import PART_SIZE, BundleStore, ObjectWriter

__all__ = [
    "PART_SIZE",
    "Bundle",
    "BundleCorrupt",
    "BundleInfo",
    "BundleKeys",
    "BundleNotFound",
    "BundleStore",
    "BundleStoreError",
    "BundleWriter",
    "Bundles",
    "FileStore",
    "Manifest",
    "ObjectWriter",
    "Part",
    "S3Store",
    "open_store",
    "read_session",
    "write_session",
]
