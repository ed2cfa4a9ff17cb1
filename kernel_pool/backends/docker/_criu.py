"""Whole-process checkpoints with CRIU: can this host's Docker engine checkpoint a sandbox?

``docker checkpoint create`` has runc run the ``criu`` found on the engine's ``PATH`` (root's;
``./run.sh`` installs CRIU 4.2.1 from Debian sid as ``/usr/local/sbin/criu``). A checkpoint of a
sandboxed kernel needs three things, which :func:`checkpoint_support` asks in turn: a CRIU new
enough for current kernels (Linux 6.16 and later need 4.2: 3.17 fails on the vDSO, 4.1 on every
socket's SO_PASSCRED), ``criu check`` passing on this host's kernel, and the engine's experimental
mode (without it Docker offers no checkpoints). Where any is missing, pauses keep the variables.

The answer is about the machine this runs on: an engine reached through a remote ``DOCKER_HOST``
runs another machine's CRIU, which is not visible from here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CRIU_MIN_VERSION = (4, 2)
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""Where runc looks for ``criu``: the ``PATH`` of an engine started as root (by systemd or by
``./run.sh``), whatever the gateway's own ``PATH``."""
CRIU_TIMEOUT_S = 10.0
RUNC_CRIU_CONFIG = Path("/etc/criu/runc.conf")
"""The CRIU configuration runc hands CRIU on every dump and restore (``org.criu.config``
annotations aside, which Docker 20.10 cannot set)."""
CRIU_HOME = Path("/opt/replgate/criu")
"""The private CRIU root ``./run.sh`` installs (``root/``, and ``rlimit_shim.so`` beside it),
which the gateway runs itself inside a sandbox's namespaces (templates, kernel trees)."""
LIBRARIES = "root/usr/lib/x86_64-linux-gnu"


@dataclass(frozen=True)
class CheckpointSupport:
    """Whether this host can checkpoint a sandbox's processes, with the sentence saying why."""

    available: bool
    reason: str
    criu_version: str | None = None
    """The version ``criu --version`` reports, None when no criu runs."""
    criu_works: bool = False
    """Whether CRIU itself can checkpoint here (new enough, and ``criu check`` passes as
    root), whatever the engine (kernel templates run CRIU without it)."""


def checkpoint_support(
    engine_info: Mapping[str, Any], *, path: str = ROOT_PATH
) -> CheckpointSupport:
    """Can the engine whose ``docker info`` is ``engine_info`` checkpoint a sandbox here?

    Blocking: runs ``criu --version`` and, as root, ``criu check`` (about 0.1 s together); call
    it off the event loop. Not as root, ``criu check`` cannot run, and the answer rests on the
    version and the engine (a dump the kernel then refuses fails at the pause, which keeps the
    variables instead). ``path`` is searched for ``criu`` in place of root's ``PATH``.
    """
    criu = shutil.which("criu", path=path)
    if criu is None:
        return CheckpointSupport(False, "no criu on root's PATH (./run.sh installs CRIU 4.2.1)")
    version = _version(criu)
    if version is None:
        return CheckpointSupport(False, f"{criu} --version does not answer with a version")
    if _numbers(version) < CRIU_MIN_VERSION:
        return CheckpointSupport(
            False, f"criu {version} is older than 4.2, which Linux 6.16 and later need",
            version)
    if os.geteuid() == 0:
        problem = _check_fails(criu)
        if problem is not None:
            return CheckpointSupport(
                False, f"criu {version}: this host's kernel cannot checkpoint (criu check: "
                       f"{problem})", version)
        checked = "passes criu check"
    else:
        checked = "found (criu check needs root: not run)"
    works = os.geteuid() == 0
    if not engine_info.get("ExperimentalBuild"):
        return CheckpointSupport(
            False, f"criu {version} {checked}, but the Docker engine's experimental mode is off "
                   "(\"experimental\": true in /etc/docker/daemon.json), which docker "
                   "checkpoint needs", version, works)
    return CheckpointSupport(
        True, f"criu {version} {checked} and the engine's experimental mode is on", version,
        works)


def _version(criu: str) -> str | None:
    try:
        done = subprocess.run([criu, "--version"], capture_output=True, text=True,
                              timeout=CRIU_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"^Version:\s*(\d+(?:\.\d+)*)", done.stdout, re.MULTILINE)
    return found.group(1) if found else None


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _check_fails(criu: str) -> str | None:
    """None when ``criu check`` passes, else its first error (its last line says only "Does
    not look good")."""
    try:
        done = subprocess.run([criu, "check"], capture_output=True, text=True,
                              timeout=CRIU_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    lines = (done.stdout + done.stderr).strip().splitlines()
    errors = [line for line in lines if line.startswith("Error")]
    if errors:
        return errors[0]
    return lines[-1] if lines else f"exit status {done.returncode}"


def dumps_file_locks(config: Path = RUNC_CRIU_CONFIG) -> bool:
    """Whether runc's CRIU configuration keeps file locks (``file-locks``, which ``./run.sh``
    writes): without it a dump of a process holding one fails (Deno's kernel, its caches'
    locks). Blocking (a small file)."""
    try:
        lines = config.read_text().splitlines()
    except OSError:
        return False
    return any(line.split("#", 1)[0].strip() in ("file-locks", "--file-locks") for line in lines)


def criu_command(home: str) -> list[str]:
    """The private CRIU root's ``criu``, run by that root's own loader and libraries, the root
    reached at ``home`` (:data:`CRIU_HOME`, or a descriptor's path to it from another mount
    namespace)."""
    libraries = f"{home}/{LIBRARIES}"
    preload = (["--preload", f"{home}/rlimit_shim.so"]
               if (CRIU_HOME / "rlimit_shim.so").is_file() else [])
    return [f"{libraries}/ld-linux-x86-64.so.2", *preload, "--library-path", libraries,
            f"{home}/root/usr/sbin/criu"]
