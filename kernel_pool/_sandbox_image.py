"""Which sandbox image this code runs: tagged by a hash of ``sandbox_image/``.

Pure hashing, no container engine: the settings name the image without importing the Docker
SDK; :mod:`kernel_pool.backends.docker` builds it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from kernel_pool.exceptions import ImageError

IMAGE_REPOSITORY = "replgate-sandbox"


def context_dir() -> Path:
    """The ``sandbox_image`` folder: inside the installed package, or beside it in a checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "sandbox_image", here.parent / "sandbox_image"):
        if (candidate / "Dockerfile").is_file():
            return candidate
    raise ImageError("sandbox_image/ not found next to kernel_pool; reinstall replgate")


def current_image() -> str:
    """The image this code runs: tagged by the hash of its ``sandbox_image/``.

    Not ``:latest``, which another checkout's build may move under a running pool.
    """
    return f"{IMAGE_REPOSITORY}:{content_version(context_dir())}"


def content_version(context: Path) -> str:
    """A short hash of every file in the build context (paths and bytes)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        if "__pycache__" in path.parts:
            continue
        digest.update(str(path.relative_to(context)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]
