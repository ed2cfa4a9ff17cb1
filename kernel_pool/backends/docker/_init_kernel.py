"""Kernels started by the container's PID 1 (``replgate_kernel/init.py``), seen from the host.

The host writes a launch request into the sandbox's socket folder and signals PID 1, which
starts the kernel as its own child (so a checkpoint of the container holds it) and records the
kernel's pid (as the container sees it) and, once reaped, its exit code in that folder. The
folder is writable by the sandbox, so every record is read as untrusted: without following
links, bounded, a plain integer in range; and a recorded pid is accepted only if the host's
process table shows it as a child of that container's PID 1 (a tampered record can at most
name another process of the same sandbox, which steers nothing on the host).
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from pathlib import Path

from kernel_pool._disk import SANDBOX_GID, SANDBOX_UID

REQUEST_NAME = "launch.json"
KERNEL_NAME = re.compile(r"k[0-9]{1,9}")
CONTEXT_KERNEL_NAME = re.compile(r"x[0-9a-f]{8}k[0-9]{1,9}")
"""A code context's kernel: its context's name, then its start's number."""
"""The names the host gives kernels (``k1``, ``k2``, ...), as PID 1 accepts them."""
PID_WAIT_S = 10.0
"""How long PID 1 may take to record a kernel it was asked for (a busy host, a cold cache)."""
EXIT_CODE_RANGE = range(-64, 256)
"""What ``os.waitstatus_to_exitcode`` can give: an exit status, or minus a signal number."""


def write_for_sandbox(path: Path, text: str) -> None:
    """Create ``path`` in the sandbox's socket folder afresh with ``text``, readable by the
    sandbox's user only (blocking). Whatever the sandbox planted at that name is removed
    (unlink never follows a link) and the file is made without following one, so the
    gateway's privileges cannot be turned on a host file."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        if os.geteuid() == 0:
            os.fchown(f.fileno(), SANDBOX_UID, SANDBOX_GID)
        f.write(text)


def request_kernel(socket_dir: Path, name: str, max_output_bytes: int,
                   language: str = "python", env: dict[str, str] | None = None) -> None:
    """Write the launch request PID 1 reads on SIGUSR1 (blocking): a kernel of ``language``
    (one of :data:`kernel_pool._languages.KERNEL_LANGUAGES`; a language the image lacks is
    recorded as an exit with 127 at once), with ``env`` over the container's environment."""
    request: dict[str, object] = {"name": name, "max_output_bytes": max_output_bytes,
                                  "language": language}
    if env:
        request["env"] = env
    write_for_sandbox(socket_dir / REQUEST_NAME, json.dumps(request))


def request_adoption(socket_dir: Path, name: str, pid: int) -> None:
    """Write the request PID 1 reads on SIGUSR1 to adopt kernel ``name``, restored as its
    child with ``pid`` (its pid in the container), instead of starting one (blocking)."""
    write_for_sandbox(socket_dir / REQUEST_NAME, json.dumps({"name": name, "adopt": pid}))


def read_untrusted(path: Path, limit: int) -> bytes | None:
    """Up to ``limit`` bytes of the file at ``path`` in the sandbox's socket folder; None
    unless it is a regular file (a link is never followed, a FIFO never blocks the reader)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None  # a FIFO or device planted there: never read (it could block)
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


START_ERRORS_BYTES = 4096
START_ERRORS_LINES = 20


def start_errors(socket_dir: Path, name: str) -> str | None:
    """The last lines (at most :data:`START_ERRORS_LINES`, :data:`START_ERRORS_BYTES`) of
    kernel ``name``'s standard error while it started (``/kernel/<name>.err``, which the
    kernel lets go of once it has: ``replgate_kernel.startup``), read as untrusted; None
    when the file is missing or holds only blanks (blocking)."""
    try:
        fd = os.open(socket_dir / f"{name}.err", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None  # a FIFO or device planted there: never read
        os.lseek(fd, max(0, info.st_size - START_ERRORS_BYTES), os.SEEK_SET)
        raw = os.read(fd, START_ERRORS_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    lines = raw.decode(errors="replace").splitlines()
    if len(raw) == START_ERRORS_BYTES and info.st_size > START_ERRORS_BYTES:
        lines = lines[1:]  # the first was cut
    text = "\n".join(lines[-START_ERRORS_LINES:]).strip()
    return text or None


def read_record(path: Path) -> int | None:
    """The integer PID 1 wrote at ``path``, or None when it is missing or malformed."""
    raw = read_untrusted(path, 32)
    if raw is None:
        return None
    try:
        return int(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return None


def exit_code(socket_dir: Path, name: str) -> int | None:
    """The kernel's exit code as PID 1 recorded it, if it did (and it is in range)."""
    code = read_record(socket_dir / f"{name}.exit")
    return code if code is not None and code in EXIT_CODE_RANGE else None


def _status(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            text = f.read(8192).decode(errors="replace")
    except OSError:
        return {}
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def host_pid(init_pid: int, container_pid: int) -> int | None:
    """The host pid of PID 1's child that the container knows as ``container_pid``."""
    if init_pid <= 0 or container_pid <= 1:
        return None
    try:
        with open(f"/proc/{init_pid}/task/{init_pid}/children", "rb") as f:
            children = [int(pid) for pid in f.read(1 << 16).split()]
    except (OSError, ValueError):
        return None
    for pid in children:
        status = _status(pid)
        nspids = status.get("NSpid", "").split()
        if (status.get("PPid", "").strip() == str(init_pid) and nspids
                and nspids[-1] == str(container_pid)
                and status.get("State", "").split()[:1] not in (["Z"], ["X"])):
            return pid
    return None


def container_pid(pid: int) -> int | None:
    """The pid the innermost pid namespace knows host process ``pid`` by."""
    nspids = _status(pid).get("NSpid", "").split()
    return int(nspids[-1]) if nspids and nspids[-1].isdigit() else None


def find_kernel(socket_dir: Path, name: str, init_pid: int,
                wait_s: float = 0.0) -> tuple[int | None, int | None]:
    """(host pid, exit code) of kernel ``name``: the pid while it runs, the exit code once
    PID 1 reaped it; (None, None) when neither appears within ``wait_s`` (blocking)."""
    deadline = time.monotonic() + wait_s
    while True:
        recorded = read_record(socket_dir / f"{name}.pid")
        if recorded is not None:
            pid = host_pid(init_pid, recorded)
            if pid is not None:
                return pid, None
            code = exit_code(socket_dir, name)
            if code is not None:
                return None, code
        if time.monotonic() >= deadline:
            return None, None
        time.sleep(0.005)


def latest_kernel(socket_dir: Path) -> str | None:
    """The newest kernel PID 1 started in this folder and has not reaped (for a gateway that
    takes a running sandbox back)."""
    numbers = []
    for path in socket_dir.glob("k*.pid"):
        # Only the host's names: str.isdigit() also takes "k²", which int() then refuses.
        stem = path.stem
        if KERNEL_NAME.fullmatch(stem) and not (socket_dir / f"{stem}.exit").exists():
            numbers.append(int(stem[1:]))
    return f"k{max(numbers)}" if numbers else None
