"""The bundle store a URL names: the one place that knows every kind of store."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit

from kernel_pool.bundles._file import FileStore
from kernel_pool.bundles._s3 import S3Store
from kernel_pool.bundles._store import BundleStore


def open_store(url: str) -> BundleStore:
    """The store ``url`` names: ``s3://bucket/prefix`` or ``file:///absolute/path``."""
    parts = urlsplit(url)
    if parts.scheme == "s3":
        return S3Store(url)
    if parts.scheme == "file" and parts.netloc in {"", "localhost"} and parts.path.startswith("/"):
        return FileStore(Path(unquote(parts.path)))
    raise ValueError(f"REPLGATE_BUNDLE_STORE must be s3://bucket/prefix or file:///path, "
                     f"not {url!r}")
