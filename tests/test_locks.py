"""The locks: every Python package a user installs, and every package in the sandbox image,
is pinned with hashes in the repository, and the locks agree with what they lock.

``./run.sh`` installs the project from ``uv.lock`` (``uv sync --frozen``) and the image from
``sandbox_image/requirements.txt`` (``pip --require-hashes``); ``./run.sh lock`` updates both.
uv is the one the run installed (``.tools``, from ``setup/uv-requirements.txt``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

import docker
from packaging.markers import Marker
from packaging.requirements import Requirement

from kernel_pool._sandbox_image import current_image
from tests.conftest import REPO

UV = Path(os.environ.get("REPLGATE_TOOLS", REPO / ".tools")) / "bin" / "uv"
IMAGE_LOCK = REPO / "sandbox_image" / "requirements.txt"
IMAGE_CHOSEN = REPO / "sandbox_image" / "requirements.in"


def uv(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    assert UV.is_file(), f"{UV} is missing: ./run.sh installs it (setup/uv-requirements.txt)"
    return subprocess.run([str(UV), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"})


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    hashes: tuple[str, ...]
    marker: str


def locked_requirements(text: str) -> list[Pin]:
    """The pins of a ``--generate-hashes`` requirements file (a name may have one per marker)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    pins: list[Pin] = []
    for line in joined.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})", line)
        requirement = Requirement(re.sub(r"\s--hash=\S+", "", line).strip())
        (pin,) = requirement.specifier
        assert pin.operator == "==", f"{line!r} is not pinned with =="
        pins.append(Pin(requirement.name.lower().replace("_", "-"), pin.version, tuple(hashes),
                        str(requirement.marker or "")))
    return pins


def test_uv_lock_agrees_with_pyproject() -> None:
    done = uv("lock", "--check")
    assert done.returncode == 0, f"uv.lock is out of date: run ./run.sh lock\n{done.stderr}"


def test_uv_lock_check_fails_when_pyproject_asks_for_more(tmp_path: Path) -> None:
    """The check above can fail: a dependency added to pyproject.toml alone is caught."""
    for name in ("pyproject.toml", "uv.lock", "README.md"):
        shutil.copy(REPO / name, tmp_path / name)
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace(
        '"httpx>=0.27,<1",', '"httpx>=0.27,<1",\n    "six>=1.16",', 1))
    done = uv("lock", "--check", cwd=tmp_path)
    assert done.returncode != 0, "uv lock --check accepted a pyproject.toml the lock lacks"


def test_uv_lock_pins_every_package_with_hashes() -> None:
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    packages = [p for p in lock["package"] if p.get("source", {}).get("registry")]
    assert len(packages) > 100  # every extra's dependencies, transitive ones included
    for package in packages:
        artifacts = [*package.get("wheels", []), *([package["sdist"]] if "sdist" in package
                                                   else [])]
        assert artifacts and all(a["hash"].startswith("sha256:") for a in artifacts), (
            f"{package['name']} has an artifact without a hash")


def test_serve_extra_bounds_connectrpc_with_its_protobuf() -> None:
    """connectrpc 0.12 with protobuf-py 0.7 fails at import: the published ranges exclude it."""
    serve = tomllib.loads((REPO / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]["serve"]
    ranges = {Requirement(r).name: Requirement(r).specifier for r in serve}
    assert "0.12.1" in ranges["connectrpc"] and "0.13.0" not in ranges["connectrpc"]
    assert "0.6.0" in ranges["protobuf-py"] and "0.7.0" not in ranges["protobuf-py"]


def test_image_lock_pins_every_package_with_hashes() -> None:
    pins = locked_requirements(IMAGE_LOCK.read_text())
    assert len(pins) > 40  # the curated stack and everything it pulls in
    for pin in pins:
        assert pin.hashes, f"{pin.name} in {IMAGE_LOCK.name} has no hash"
    chosen = [Requirement(line) for line in IMAGE_CHOSEN.read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    for requirement in chosen:
        name = requirement.name.lower().replace("_", "-")
        versions = [pin.version for pin in pins if pin.name == name]
        assert versions, f"{name} is in requirements.in but not in the lock"
        assert all(v in requirement.specifier for v in versions), (
            f"{name}: the lock has {versions}, requirements.in wants {requirement.specifier}")


def test_image_lock_is_what_requirements_in_compiles_to(tmp_path: Path) -> None:
    """Recompiled with the lock as the preference, requirements.in gives the lock back unchanged:
    a package added to or removed from requirements.in without ``./run.sh lock`` is caught."""
    output = tmp_path / "requirements.txt"
    shutil.copy(IMAGE_LOCK, output)
    done = uv("pip", "compile", "--quiet", "--universal", "--python-version", "3.11",
              "--generate-hashes", "--custom-compile-command", "./run.sh lock",
              str(IMAGE_CHOSEN.relative_to(REPO)), "-o", str(output))
    assert done.returncode == 0, done.stderr
    assert locked_requirements(output.read_text()) == locked_requirements(
        IMAGE_LOCK.read_text()), "sandbox_image/requirements.txt is out of date: ./run.sh lock"


def test_image_holds_exactly_the_locked_versions(docker_client: docker.DockerClient) -> None:
    """The image's own Python, its platform and ``pip list`` against the lock's markers."""
    script = ("import json, platform, subprocess, sys; "
              "print(json.dumps([platform.python_version(), subprocess.run("
              "[sys.executable, '-m', 'pip', 'list', '--format=freeze', '--exclude', 'pip', "
              "'--exclude', 'setuptools'], capture_output=True, text=True).stdout]))")
    answer = docker_client.containers.run(
        current_image(), ["/opt/venv/bin/python", "-c", script], entrypoint=[],
        network_mode="none", remove=True)
    python, frozen = json.loads(answer)
    environment = {"python_full_version": python, "python_version": python.rsplit(".", 1)[0],
                   "sys_platform": "linux", "platform_system": "Linux",
                   "implementation_name": "cpython", "platform_python_implementation": "CPython",
                   "platform_machine": os.uname().machine}
    wanted = {pin.name: pin.version for pin in locked_requirements(IMAGE_LOCK.read_text())
              if not pin.marker or Marker(pin.marker).evaluate(environment)}
    installed = dict(line.lower().replace("_", "-").split("==") for line in frozen.split())
    assert installed == wanted


APT_LOCK = REPO / "sandbox_image" / "languages" / "apt-packages.txt"


def test_default_image_holds_the_pinned_debian_packages(docker_client: docker.DockerClient,
                                                        ) -> None:
    """Every Debian package ``apt-packages.txt`` pins (R, the JDK, git and their closure) is in
    the default image at that version."""
    pins = dict(line.split("=", 1) for line in APT_LOCK.read_text().split())
    assert "git" in pins
    answer = docker_client.containers.run(
        current_image(), ["dpkg-query", "-W", "-f", "${Package}=${Version}\\n", *pins],
        entrypoint=[], network_mode="none", remove=True)
    installed = dict(line.split("=", 1) for line in answer.decode().split())
    assert installed == pins
