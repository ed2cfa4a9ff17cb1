"""Which sandbox images this code runs: each tagged by a hash of what it is built from.

Pure hashing, no container engine: the settings name the images without importing the Docker
SDK; :mod:`kernel_pool.backends.docker` builds them. Both images are targets of
``sandbox_image/Dockerfile``: the default one (Python, bash, R, JavaScript/TypeScript, Java) and
the slim one (Python and bash), which a profile names with ``image = "slim"``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from kernel_pool.exceptions import ImageError

IMAGE_REPOSITORY = "replgate-sandbox"
SLIM_REPOSITORY = "replgate-sandbox-slim"
SLIM = "slim"
"""What a profile's ``image`` may say to name the slim image this code builds."""
DEFAULT_NAMES = ("default", "polyglot")
"""What a profile's ``image`` may say to name the default image: ``polyglot`` was the name of
the image with every language when the default one had Python and bash only."""


def context_dir() -> Path:
    """The ``sandbox_image`` folder: inside the installed package, or beside it in a checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "sandbox_image", here.parent / "sandbox_image"):
        if (candidate / "Dockerfile").is_file():
            return candidate
    raise ImageError("sandbox_image/ not found next to kernel_pool; reinstall replgate")


def current_image() -> str:
    """The default image this code runs: tagged by the hash of its ``sandbox_image/``.

    Not ``:latest``, which another checkout's build may move under a running pool.
    """
    return f"{IMAGE_REPOSITORY}:{content_version(context_dir())}"


def slim_image() -> str:
    """The slim image this code builds (the same tag as the default one's)."""
    return f"{SLIM_REPOSITORY}:{content_version(context_dir())}"


def named_image(name: str) -> str:
    """The image a profile's ``image`` names: ``slim``, ``default`` (or ``polyglot``) for this
    code's images, anything else as it is (an image of the user's own)."""
    if name == SLIM:
        return slim_image()
    return current_image() if name in DEFAULT_NAMES else name


def content_version(context: Path) -> str:
    """A short hash of every file in the build context (paths and bytes)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        if "__pycache__" in path.parts:
            continue
        digest.update(str(path.relative_to(context)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]
