"""Build the sandbox images the pool runs (their tags: :mod:`kernel_pool._sandbox_image`).

The tag is a hash of ``sandbox_image/``'s files, so a changed Dockerfile or pin gives a new
image and an unchanged one is not rebuilt. The base is picked automatically: the official slim
Python image where a registry answers, else a Debian root made locally with ``debootstrap`` and
``docker import`` (no registry needed). The polyglot image (R and Deno's kernels too) is built
on the default one, from ``sandbox_image/polyglot/``, only when asked for.
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
    POLYGLOT,
    POLYGLOT_REPOSITORY,
    content_version,
    context_dir,
    polyglot_version,
)
from kernel_pool.exceptions import ImageError

LATEST_IMAGE = f"{IMAGE_REPOSITORY}:latest"
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
    force: bool = False,
    log: Log = print,
) -> ImageInfo:
    """Build the sandbox image unless the current one is there; record it in ``state_dir``."""
    context = context_dir()
    version = content_version(context)
    tag = f"{IMAGE_REPOSITORY}:{version}"
    image = None if force else _present(client, tag)
    if image is None:
        base = choose_base(client, log)
        log(f"building {tag} from {base} (first time: a few minutes)")
        with tempfile.TemporaryDirectory(prefix="replgate-image-") as tmp:
            build_context = _copy_context(context, Path(tmp), POLYGLOT)
            _stream_build(client, build_context, tag, version, log,
                          {"BASE": base}, {"io.replgate.base": base})
        image = client.images.get(tag)
    else:
        base = str(image.labels.get("io.replgate.base", "unknown"))
    image.tag(IMAGE_REPOSITORY, "latest")  # for people; the pool uses the content tag
    info = ImageInfo(tag=tag, id=str(image.id), version=version,
                     base=str(image.labels.get("io.replgate.base", base)))
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "image.json").write_text(info.model_dump_json(indent=2))
    return info


def build_polyglot_image(
    client: docker.DockerClient,
    *,
    state_dir: Path,
    force: bool = False,
    log: Log = print,
) -> ImageInfo:
    """Build the polyglot image (the default one, built first if missing, plus the R and
    JavaScript/TypeScript kernels) unless the current one is there (blocking)."""
    default = build_image(client, state_dir=state_dir, log=log)
    context = context_dir()
    version = polyglot_version(context)
    tag = f"{POLYGLOT_REPOSITORY}:{version}"
    image = None if force else _present(client, tag)
    if image is None:
        log(f"building {tag} on {default.tag} (R, Deno: about two minutes)")
        with tempfile.TemporaryDirectory(prefix="replgate-image-") as tmp:
            build_context = _copy_context(context / POLYGLOT, Path(tmp))
            _stream_build(client, build_context, tag, version, log,
                          {"SANDBOX_IMAGE": default.tag}, {"io.replgate.base": default.tag})
        image = client.images.get(tag)
    return ImageInfo(tag=tag, id=str(image.id), version=version, base=default.tag)


def _present(client: docker.DockerClient, tag: str) -> Image | None:
    """The engine's image of ``tag``, or None when it has none."""
    try:
        return client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None


def _copy_context(source: Path, tmp: Path, *skip: str) -> Path:
    """A build context: ``source``'s files (but ``skip``) and ``host-ca.crt``, the build host's
    CA bundle (empty when it has none), for a build behind the same TLS-inspecting proxy."""
    context = tmp / "context"
    shutil.copytree(source, context, ignore=shutil.ignore_patterns("__pycache__", *skip))
    ca = next((p for p in HOST_CA_BUNDLES if Path(p).is_file()), None)
    (context / "host-ca.crt").write_bytes(Path(ca).read_bytes() if ca else b"")
    return context


def _stream_build(client: docker.DockerClient, context: Path, tag: str, version: str, log: Log,
                  args: dict[str, str], labels: dict[str, str]) -> None:
    stream: Any = client.api.build(
        path=str(context), tag=tag, rm=True, forcerm=True, decode=True,
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
