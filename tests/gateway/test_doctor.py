"""``replgate doctor`` against the real engine: one line per check, exit status 1 on a problem."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import docker
import pytest

from gateway.doctor import kernel_templates, memory_pauses, snapshot_compression
from kernel_pool.backends.docker import CheckpointSupport, current_image, slim_image
from tests.conftest import REPO


def _doctor(**env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("REPLGATE_")}
    return subprocess.run([sys.executable, "-m", "gateway.cli", "doctor"], cwd=REPO,
                          env={**base, **env}, capture_output=True, text=True, timeout=60)


def test_doctor_passes_gvisor_profile_on_configured_engine(
        docker_client: docker.DockerClient) -> None:
    done = _doctor(REPLGATE_RUNTIME="gvisor")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok      profile default: runtime gvisor is available" in done.stdout
    # ./run.sh installs CRIU 4.2 and runs its engine in experimental mode
    assert "ok      memory pauses: available; criu 4.2" in done.stdout
    assert "ok      kernel templates: available;" in done.stdout
    # ./run.sh installs Debian's zstd too
    assert "ok      pause snapshots: compressed as they stream, by /" in done.stdout
    assert "PROBLEM" not in done.stdout


def test_doctor_reports_missing_engine_with_exit_status_1() -> None:
    done = _doctor(DOCKER_HOST="unix:///nonexistent/docker.sock")
    assert done.returncode == 1
    assert done.stdout.startswith("PROBLEM no Docker engine answers"), done.stdout


def test_memory_pauses_line_without_criu_says_what_pauses_keep() -> None:
    missing = CheckpointSupport(False, "no criu on root's PATH")
    assert memory_pauses(missing, "memory") == (
        "memory pauses: not available, so pauses keep variables although "
        "REPLGATE_PAUSE_WITH=memory; no criu on root's PATH")
    assert memory_pauses(missing, "variables") == (
        "memory pauses: not available, so pauses keep variables; no criu on root's PATH")


def test_kernel_templates_line_says_why_kernels_boot() -> None:
    missing = CheckpointSupport(False, "no criu on root's PATH")
    assert kernel_templates(missing, True) == (
        "kernel templates: not available, so kernels boot; no criu on root's PATH")
    assert kernel_templates(missing, False) == (
        "kernel templates: off (REPLGATE_KERNEL_TEMPLATES=false), so kernels boot")


def test_snapshot_compression_line_without_zstd_names_the_package() -> None:
    assert snapshot_compression(None) == (
        "pause snapshots: stored uncompressed, no zstd on PATH; install Debian's "
        "(sudo apt-get install zstd; ./run.sh does)")
    assert snapshot_compression("/usr/bin/zstd") == (
        "pause snapshots: compressed as they stream, by /usr/bin/zstd (zstd --fast=1, all cores)")


@pytest.mark.parametrize(("arguments", "env", "built"), [
    ([], {}, ["default"]),
    (["--slim"], {}, ["default", "slim"]),
    ([], {"REPLGATE_IMAGE": "slim"}, ["slim"]),
    (["--polyglot"], {"REPLGATE_IMAGE": "polyglot"}, ["default"]),
])
def test_image_build_builds_the_images_the_profiles_name(
        tmp_path: Path, arguments: list[str], env: dict[str, str], built: list[str]) -> None:
    """The default image (every language) unless the profiles name only the slim one, which
    --slim adds; both are up to date here (./run.sh test built them), so nothing is rebuilt.
    --polyglot, from scripts older than the default image of every language, still works."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("REPLGATE_")}
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "image", "build", *arguments], cwd=REPO,
        env={**base, "REPLGATE_STATE_DIR": str(tmp_path), **env}, capture_output=True,
        text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    tags = {"default": current_image(), "slim": slim_image()}
    assert [line.split()[0] for line in done.stdout.splitlines()] == [tags[b] for b in built]
