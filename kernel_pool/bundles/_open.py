"""The bundle store a URL names: the one place that knows every kind of store."""

from __future__ import annotations

from kernel_pool.bundles._file import FileStore
from kernel_pool.bundles._s3 import S3Store
from kernel_pool.bundles._store import BundleStore
from kernel_pool.config import store_folder


def open_store(url: str) -> BundleStore:
    """The store ``url`` names: ``s3://bucket/prefix`` or ``file:///absolute/path``."""
    folder = store_folder(url)
    return S3Store(url) if folder is None else FileStore(folder)
