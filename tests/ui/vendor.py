"""The web UI's vendored npm files (gateway/static/vendor/): their lock, and the way to renew them.

The files are committed, so neither a fresh install nor the page needs npm; ``lock.json`` names,
for each npm package, its version, license and npm's integrity of its tarball, and for each
file taken from it, the path inside the tarball and the file's sha256. The tests check the files
against the lock offline, and the lock against what npm serves for those versions.

To take other versions: edit the versions in lock.json, then

    .venv/bin/python -m tests.ui.vendor

which packs each package with npm, copies the files the lock names and writes their hashes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import REPO

VENDOR = REPO / "gateway" / "static" / "vendor"
LOCK = VENDOR / "lock.json"


def load_lock(vendor: Path = VENDOR) -> list[dict[str, Any]]:
    packages: list[dict[str, Any]] = json.loads((vendor / LOCK.name).read_text())["packages"]
    return packages


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def mismatches(vendor: Path = VENDOR) -> list[str]:
    """What in ``vendor`` disagrees with its lock: a changed, missing or unlisted file."""
    found: list[str] = []
    listed: set[str] = set()
    for package in load_lock(vendor):
        for name, entry in package["files"].items():
            listed.add(name)
            path = vendor / name
            if not path.is_file():
                found.append(f"{name} ({package['name']}) is missing")
            elif sha256(path.read_bytes()) != entry["sha256"]:
                found.append(f"{name} ({package['name']}) is not the locked file")
    present = {path.name for path in vendor.iterdir()} - {LOCK.name}
    found += [f"{name} is not in {LOCK.name}" for name in sorted(present - listed)]
    return found


@dataclass(frozen=True)
class Packed:
    """One package as npm serves it: the tarball's integrity and its members' bytes."""

    integrity: str
    members: dict[str, bytes]


def npm_pack(name: str, version: str, into: Path) -> Packed:
    """``npm pack name@version`` into ``into`` (npm's cache answers a second time offline)."""
    npm = shutil.which("npm")
    assert npm, "npm is missing: ./run.sh installs Debian's nodejs and npm (ensure_node)"
    done = subprocess.run([npm, "pack", f"{name}@{version}", "--json", "--pack-destination",
                           str(into), "--loglevel=error"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    (info,) = json.loads(done.stdout)
    with tarfile.open(into / info["filename"]) as tar:
        members = {member.name: tar.extractfile(member).read()  # type: ignore[union-attr]
                   for member in tar.getmembers() if member.isfile()}
    return Packed(integrity=info["integrity"], members=members)


def renew(into: Path) -> None:
    """Pack each locked package's version, copy its files here and write their hashes."""
    lock = load_lock()
    for package in lock:
        packed = npm_pack(package["name"], package["version"], into)
        package["integrity"] = packed.integrity
        for name, entry in package["files"].items():
            data = packed.members[entry["from"]]
            (VENDOR / name).write_bytes(data)
            entry["sha256"] = sha256(data)
    LOCK.write_text(json.dumps({"packages": lock}, indent=2) + "\n")


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        renew(Path(folder))
    problems = mismatches()
    print("\n".join(problems) or f"{LOCK.relative_to(REPO)} renewed")
    sys.exit(1 if problems else 0)
