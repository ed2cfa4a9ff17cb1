"""Build the sandbox images the pool runs (their tags: :mod:`kernel_pool._sandbox_image`).

The tag is a hash of ``sandbox_image/``'s files, so a changed Dockerfile or pin gives a new
image and an unchanged one is not rebuilt; the engine's layer cache keeps the heavy layers
(packages, R, the JDK, Deno) across changes to the kernel's own files (the Dockerfile's order).
The base is picked automatically: the official slim Python image where a registry answers, else
a Debian root made locally with ``debootstrap`` and ``docker import`` (no registry needed). The
default image (every language) and the slim one (Python and bash) are two targets of one
Dockerfile; the slim one is built only when asked for.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.images import Image
from pydantic import BaseModel

from kernel_pool._sandbox_image import (
    IMAGE_REPOSITORY,
    SLIM,
    SLIM_REPOSITORY,
    content_version,
    context_dir,
)
from kernel_pool.exceptions import ImageError

REGISTRY_BASE = "python:3.11-slim-bookworm"
LOCAL_BASE = "replgate-base:bookworm"
HOST_CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")

Log = Callable[[str], None]


class ImageInfo(BaseModel):
    """What was built: recorded beside the state so the pool and the audit log can cite it."""

    tag: str
    id: str
    version: str
    base: str


def _pull_with_timeout(client: docker.DockerClient, ref: str, seconds: float) -> bool:
    done: list[bool] = []

    def pull() -> None:
        try:
            client.images.pull(ref)
            done.append(True)
        except docker.errors.APIError:
            done.append(False)

    worker = threading.Thread(target=pull, daemon=True)
    worker.start()
    worker.join(seconds)
    return bool(done and done[0])


def _debian_mirror() -> str:
    return os.environ.get("REPLGATE_DEBIAN_MIRROR", "http://deb.debian.org/debian")


def _build_local_base(log: Log) -> None:
    if os.geteuid() != 0:
        raise ImageError(
            "No container registry is reachable and building a local base image needs root "
            f"(debootstrap). Run `replgate image build` as root, or make {REGISTRY_BASE} available."
        )
    if shutil.which("debootstrap") is None:
        subprocess.run(["apt-get", "install", "-y", "-qq", "debootstrap"], check=True)
    with tempfile.TemporaryDirectory(prefix="replgate-rootfs-") as rootfs:
        log(f"no registry reachable: building {LOCAL_BASE} with debootstrap (about a minute)")
        subprocess.run(
            [
                "debootstrap", "--variant=minbase",
                "--include=python3,python3-venv,ca-certificates",
                "bookworm", rootfs, _debian_mirror(),
            ],
            check=True, stdout=subprocess.DEVNULL,
        )
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            shutil.rmtree(Path(rootfs, cache), ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(["docker", "import", "-", LOCAL_BASE], stdin=tar.stdout, check=True,
                       stdout=subprocess.DEVNULL)
        if tar.wait() != 0:
            raise ImageError("packing the debootstrap root for docker import failed")


def choose_base(client: docker.DockerClient, log: Log) -> str:
    """The registry's slim Python image when present or pullable, else a local Debian base."""
    for ref in (REGISTRY_BASE, LOCAL_BASE):
        try:
            client.images.get(ref)
            return ref
        except docker.errors.ImageNotFound:
            pass
    if _pull_with_timeout(client, REGISTRY_BASE, 60):
        return REGISTRY_BASE
    _build_local_base(log)
    return LOCAL_BASE


def build_image(
    client: docker.DockerClient,
    *,
    state_dir: Path,
    slim: bool = False,
    force: bool = False,
    log: Log = print,
) -> ImageInfo:
    """Build the default sandbox image (``slim``: the slim one) unless the current one is
    there (blocking); the default one's build is recorded in ``state_dir``."""
    context = context_dir()
    version = content_version(context)
    repository = SLIM_REPOSITORY if slim else IMAGE_REPOSITORY
    tag = f"{repository}:{version}"
    image = None if force else _present(client, tag)
    if image is None:
        base = choose_base(client, log)
        what = "Python and bash" if slim else "Python, bash, R, Deno, Java"
        log(f"building {tag} ({what}) from {base} (first time: a few minutes)")
        with tempfile.TemporaryDirectory(prefix="replgate-image-") as tmp:
            build_context = _copy_context(context, Path(tmp))
            _stream_build(client, build_context, tag, version, log, SLIM if slim else "default",
                          {"BASE": base}, {"io.replgate.base": base})
        image = client.images.get(tag)
    else:
        base = str(image.labels.get("io.replgate.base", "unknown"))
    image.tag(repository, "latest")  # for people; the pool uses the content tag
    info = ImageInfo(tag=tag, id=str(image.id), version=version,
                     base=str(image.labels.get("io.replgate.base", base)))
    if not slim:
        state_dir.mkdir(parents=True, exist_ok=True)
        (state_dir / "image.json").write_text(info.model_dump_json(indent=2))
    return info


def _present(client: docker.DockerClient, tag: str) -> Image | None:
    """The engine's image of ``tag``, or None when it has none."""
    try:
        return client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None


def _copy_context(source: Path, tmp: Path) -> Path:
    """A build context: ``source``'s files and ``host-ca.crt``, the build host's CA bundle
    (empty when it has none), for a build behind the same TLS-inspecting proxy."""
    context = tmp / "context"
    shutil.copytree(source, context, ignore=shutil.ignore_patterns("__pycache__"))
    ca = next((p for p in HOST_CA_BUNDLES if Path(p).is_file()), None)
    (context / "host-ca.crt").write_bytes(Path(ca).read_bytes() if ca else b"")
    return context


def _stream_build(client: docker.DockerClient, context: Path, tag: str, version: str, log: Log,
                  target: str, args: dict[str, str], labels: dict[str, str]) -> None:
    stream: Any = client.api.build(
        path=str(context), tag=tag, target=target, rm=True, forcerm=True, decode=True,
        network_mode="host",
        buildargs={**args, "REPLGATE_IMAGE_VERSION": version},
        labels=labels,
    )
    tail: list[str] = []
    for chunk in stream:
        if "error" in chunk:
            raise ImageError(f"building {tag} failed: {chunk['error'].strip()}\n" + "".join(tail))
        text = chunk.get("stream", "")
        if text:
            tail = [*tail[-30:], text]
            if text.startswith("Step "):
                log(text.rstrip())


def read_image_info(state_dir: Path) -> ImageInfo | None:
    """The last build recorded in ``state_dir``, if any."""
    path = state_dir / "image.json"
    try:
        return ImageInfo.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None
