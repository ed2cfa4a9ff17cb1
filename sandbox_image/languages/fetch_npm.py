"""Fetch the npm tarballs pinned in ``npm-packages.txt`` and check each against its pinned
``dist.integrity`` (the registry's SRI hash) before unpacking it; run inside the image build.

A line is ``name version integrity``. Node and npm are not needed (the sandbox image has
neither): the tarball's URL is the registry's fixed layout, and a tarball whose hash differs
from the pin fails the build, so nothing but the reviewed bytes reaches the image.
"""

import base64
import hashlib
import io
import os
import ssl
import sys
import tarfile
import urllib.request

REGISTRY = os.environ.get("NPM_REGISTRY", "https://registry.npmjs.org").rstrip("/")


def tarball_url(name: str, version: str) -> str:
    return f"{REGISTRY}/{name}/-/{name.rsplit('/', 1)[-1]}-{version}.tgz"


def check(data: bytes, integrity: str) -> None:
    algorithm, _, expected = integrity.partition("-")
    if algorithm not in ("sha512", "sha384", "sha256"):
        raise SystemExit(f"unsupported integrity {integrity!r}")
    actual = base64.b64encode(hashlib.new(algorithm, data).digest()).decode()
    if actual != expected:
        raise SystemExit(f"integrity mismatch: pinned {integrity}, got {algorithm}-{actual}")


def unpack(archive: tarfile.TarFile, folder: str) -> None:
    """Regular files only, inside ``folder`` (the image's Python, 3.11.2, predates tarfile's
    extraction filters)."""
    for member in archive.getmembers():
        path = os.path.normpath(os.path.join(folder, member.name))
        if not member.isfile() or not path.startswith(folder + os.sep):
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        source = archive.extractfile(member)
        assert source is not None
        with source, open(path, "wb") as out:
            out.write(source.read())
        os.chmod(path, 0o755 if member.mode & 0o111 else 0o644)


def main(pins: str, target: str, cafile: str) -> None:
    context = ssl.create_default_context(cafile=cafile if os.path.getsize(cafile) else None)
    with open(pins) as f:
        lines = [line.split() for line in f if line.strip() and not line.startswith("#")]
    for name, version, integrity in lines:
        url = tarball_url(name, version)
        with urllib.request.urlopen(url, context=context, timeout=300) as response:
            data = response.read()
        check(data, integrity)
        folder = os.path.join(target, name)
        os.makedirs(folder, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            unpack(archive, folder)
        print(f"{name}@{version}: {len(data)} bytes, {integrity.split('-')[0]} checked")


if __name__ == "__main__":
    main(*sys.argv[1:4])
