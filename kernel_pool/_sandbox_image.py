"""Which sandbox images this code runs: each tagged by a hash of what it is built from.

Pure hashing, no container engine: the settings name the images without importing the Docker
SDK; :mod:`kernel_pool.backends.docker` builds them. The default image is built from
``sandbox_image/`` (its ``polyglot/`` folder aside); the polyglot image, the default one plus
the R and JavaScript/TypeScript kernels, from ``sandbox_image/polyglot/`` on top of it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from kernel_pool.exceptions import ImageError

IMAGE_REPOSITORY = "replgate-sandbox"
POLYGLOT_REPOSITORY = "replgate-sandbox-polyglot"
POLYGLOT = "polyglot"
"""What a profile's ``image`` may say to name the polyglot image this code builds (its folder
under ``sandbox_image/``, too)."""


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


def polyglot_image() -> str:
    """The polyglot image this code builds: tagged by a hash of the default image's tag and
    of ``sandbox_image/polyglot/``, so a change to either gives a new one."""
    return f"{POLYGLOT_REPOSITORY}:{polyglot_version(context_dir())}"


def content_version(context: Path) -> str:
    """A short hash of every file in the build context (paths and bytes), the polyglot
    image's folder aside (the default image does not contain it)."""
    return _hash(context, skip=context / POLYGLOT)


def polyglot_version(context: Path) -> str:
    """A short hash of the default image's version and the polyglot folder's files."""
    return _hash(context / POLYGLOT, seed=content_version(context))


def _hash(folder: Path, skip: Path | None = None, seed: str = "") -> str:
    digest = hashlib.sha256(seed.encode())
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        if "__pycache__" in path.parts or (skip is not None and path.is_relative_to(skip)):
            continue
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]
