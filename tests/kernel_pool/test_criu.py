"""CRIU on this host (docker._criu): the checkpoint check, and a real dump and restore.

./run.sh installs CRIU 4.2.1 on root's PATH and runs its engine in experimental mode, so here
the check must say yes; the missing cases take the real engine's answer and change one thing.
The dump and restore run the very ``criu`` runc would run, on a process of uid 1000 as a
sandboxed kernel is: on a host where root lacks CAP_SYS_RESOURCE (this project's VMs) it passes
only through the rlimit shim that ./run.sh preloads (setup/criu_rlimit_shim.c).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from kernel_pool.backends.docker import checkpoint_support
from kernel_pool.backends.docker._criu import ROOT_PATH


@pytest.fixture(scope="module")
def engine_info(docker_client: docker.DockerClient) -> dict[str, Any]:
    info: dict[str, Any] = docker_client.info()
    return info


@pytest.fixture
def criu() -> str:
    found = shutil.which("criu", path=ROOT_PATH)
    assert found is not None, "no criu on root's PATH: ./run.sh test installs CRIU 4.2.1"
    return found


def test_checkpoint_support_says_yes_on_this_host(engine_info: dict[str, Any]) -> None:
    support = checkpoint_support(engine_info)
    assert support.available, support.reason
    assert support.criu_version is not None and support.criu_version.startswith("4.2")
    assert "passes criu check" in support.reason


def test_checkpoint_support_says_no_without_experimental_mode(
        engine_info: dict[str, Any]) -> None:
    support = checkpoint_support({**engine_info, "ExperimentalBuild": False})
    assert not support.available
    assert "experimental mode is off" in support.reason and support.criu_version is not None


def test_checkpoint_support_says_no_without_criu(
        engine_info: dict[str, Any], tmp_path: Path) -> None:
    support = checkpoint_support(engine_info, path=str(tmp_path))
    assert (support.available, support.criu_version) == (False, None)
    assert support.reason.startswith("no criu on root's PATH")


def test_checkpoint_support_says_no_with_old_criu(
        engine_info: dict[str, Any], tmp_path: Path) -> None:
    # Debian bookworm's own criu, as far as its version goes
    old = tmp_path / "criu"
    old.write_text("#!/bin/sh\necho 'Version: 3.17.1'\n")
    old.chmod(0o755)
    support = checkpoint_support(engine_info, path=str(tmp_path))
    assert (support.available, support.criu_version) == (False, "3.17.1")
    assert "older than 4.2" in support.reason


def test_checkpoint_support_names_the_failed_check(
        engine_info: dict[str, Any], tmp_path: Path) -> None:
    # what bookworm's criu 3.17 says on Linux 6.18, from a criu new enough to get that far
    failing = tmp_path / "criu"
    failing.write_text("#!/bin/sh\n"
                       "[ \"$1\" = --version ] && { echo 'Version: 4.2.1'; exit 0; }\n"
                       "echo 'Error (criu/vdso.c:1): vdso: Unexpected rt vDSO area bounds' >&2\n"
                       "echo 'Warn  (criu/cr-check.c:1): Does not look good.' >&2\n"
                       "exit 1\n")
    failing.chmod(0o755)
    assert os.geteuid() == 0, "criu check runs as root: run the tests as root (./run.sh test)"
    support = checkpoint_support(engine_info, path=str(tmp_path))
    assert (support.available, support.criu_version) == (False, "4.2.1")
    assert support.reason.endswith("cannot checkpoint (criu check: Error (criu/vdso.c:1): vdso: "
                                   "Unexpected rt vDSO area bounds)"), support.reason


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """``sleep`` as uid 1000 in a session of its own, with limits of its own."""
    process = subprocess.Popen(
        ["prlimit", "--nofile=123:456", "--", "setpriv", "--reuid=1000", "--regid=1000",
         "--clear-groups", "sleep", "300"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    yield process
    if process.poll() is None:
        process.kill()
    elif _is_sleeper(process.pid):  # restored: the same pid, no longer our child
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


def _is_sleeper(pid: int) -> bool:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    return _uid_of(pid) == 1000 and command == b"sleep\x00300\x00"


def _uid_of(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return None
    return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])


def _criu(criu: str, *arguments: str, images: Path) -> None:
    done = subprocess.run([criu, *arguments, "-D", str(images), "--shell-job", "-o", "criu.log"],
                          capture_output=True, text=True, timeout=60, check=False)
    log = (images / "criu.log").read_text() if (images / "criu.log").exists() else ""
    assert done.returncode == 0, f"criu {arguments[0]} failed:\n{log[-2000:]}{done.stderr}"


def test_criu_dumps_and_restores_uid_1000_process(
        criu: str, sleeper: subprocess.Popen[bytes], tmp_path: Path) -> None:
    deadline = time.monotonic() + 10
    while not _is_sleeper(sleeper.pid):
        assert time.monotonic() < deadline, "the sleeper never became uid 1000's sleep"
        time.sleep(0.02)
    images = tmp_path / "images"
    images.mkdir()
    _criu(criu, "dump", "-t", str(sleeper.pid), images=images)
    assert sleeper.wait(timeout=10) == -signal.SIGKILL  # a dump ends the process it keeps
    _criu(criu, "restore", "-d", images=images)
    # the same pid again, of uid 1000, with the limits read through the shim
    assert _is_sleeper(sleeper.pid)
    limits = Path(f"/proc/{sleeper.pid}/limits").read_text()
    assert next(line for line in limits.splitlines()
                if line.startswith("Max open files")).split()[3:5] == ["123", "456"]
