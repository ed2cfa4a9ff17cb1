"""The bundle store's errors, in kernel_pool's tree (:mod:`kernel_pool.exceptions`)::

    SnapshotError
    ├── BundleNotFound     no bundle (or object) under that key
    └── BundleCorrupt      tampered, truncated, or sealed with another key: refused
    BackendError
    └── BundleStoreError   the storage failed or could not be reached
"""

from __future__ import annotations

from kernel_pool.exceptions import BackendError, SnapshotError


class BundleNotFound(SnapshotError):
    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"no paused-session bundle at {key!r} in the bundle store")


class BundleCorrupt(SnapshotError):
    """A bundle that does not read back as it was written; nothing of it may be restored."""

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"the bundle at {key!r} was refused and not restored: {reason}")


class BundleStoreError(BackendError):
    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        super().__init__(f"the bundle store {url} failed: {reason}")
