"""A sandbox's own boot id: what ``/proc/sys/kernel/random/boot_id`` says inside a runc
container, which would otherwise be its host's (the kernel keeps one per boot, and every
container on the host shares it).

A sandbox is the user's machine: its boot id is its own, new at each boot (a new sandbox, a
kernel restart, which ends every process of it) and kept across a pause and its resume. The
host keeps it in a file of the sandbox's private run folder (``run/<id>/boot_id``, beside its
socket folder, out of its reach), which the container mounts read-only at
:data:`IN_SANDBOX` (a mount of the container's own, so that runc's CRIU knows it as an
external mount and a memory image restores it). runc refuses any mount under ``/proc`` at
create, so once the container runs the gateway binds that file over :data:`PROC_BOOT_ID` in
the container's mount namespace (:func:`bind_boot_id`). The sandbox's user, with no capability, can
neither write nor unmount either; a new boot id is written into the host file in place, which
both mounts show at once.

The bind is made by the gateway's own process, in a thread of its own that leaves the host's
file system view (``unshare(CLONE_FS)``) for the container's mount namespace and then ends:
nothing of the container's file system (a tenant's image) is ever run or loaded as root, as
running its ``mount`` through ``nsenter`` would.

gVisor's kernel gives each sandbox (each boot of it) an id of its own: nothing is done there.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import uuid
from pathlib import Path

from kernel_pool.backends.docker._template import TemplateError, entered

logger = logging.getLogger(__name__)

IN_SANDBOX = "/run/replgate/boot_id"
"""Where the container mounts the host's file (read-only)."""
PROC_BOOT_ID = "/proc/sys/kernel/random/boot_id"
FILE_NAME = "boot_id"
"""The host's file, in the sandbox's run folder (the socket folder's parent)."""

_CLONE_FS = 0x200
_CLONE_NEWNS = 0x20000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
_MS_REMOUNT, _MS_BIND = 0x20, 0x1000

# Loaded here, once: nothing may be loaded by path once a thread is in a container's view.
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_void_p]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]


def new_boot_id() -> str:
    """A boot id as Linux makes one: a random UUID, lower-case, with dashes."""
    return str(uuid.uuid4())


def host_file(socket_dir: Path) -> Path:
    return socket_dir.parent / FILE_NAME


def write_boot_id(socket_dir: Path, boot_id: str) -> None:
    """Write ``boot_id`` into the sandbox's host file, in place (a running container's mounts
    show the file, not a path): root's, 0644, as Linux's own reads. Blocking."""
    fd = os.open(host_file(socket_dir), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{boot_id}\n".encode())
    finally:
        os.close(fd)


def read_boot_id(socket_dir: Path) -> str | None:
    """The boot id in the sandbox's host file (a running sandbox taken back), if any."""
    try:
        text = host_file(socket_dir).read_text().strip()
    except OSError:
        return None
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return None


def offered(runtime: str) -> bool:
    """Whether sandboxes of ``runtime`` get a boot id of their own here: under runc, where
    the gateway is root (it binds it); gVisor's kernel gives its own."""
    return runtime != "gvisor" and os.geteuid() == 0


def bound(init_pid: int) -> bool:
    """Whether the container whose PID 1 is host pid ``init_pid`` has its boot id bound
    (a container taken back, or restored from a memory image that holds the bind)."""
    try:
        mounts = Path(f"/proc/{init_pid}/mountinfo").read_text()
    except OSError:
        return False
    # mountinfo's fifth field is the mount point.
    return any(len(fields) > 4 and fields[4] == PROC_BOOT_ID
               for fields in (line.split() for line in mounts.splitlines()))


def bind_boot_id(init_pid: int, container_id: str) -> None:
    """Bind :data:`IN_SANDBOX` over :data:`PROC_BOOT_ID` in the mount namespace of the
    container ``container_id``, whose PID 1 is host pid ``init_pid`` (checked to be it), once:
    nothing if it is bound already. :class:`OSError` when it cannot be (a container made
    without the mount, say). Blocking."""
    if bound(init_pid):
        return
    failed: list[OSError] = []
    try:
        with entered(init_pid, container_id, ("mnt",)) as (_, fds, _):
            worker = threading.Thread(target=_bind_in, args=(fds[0], failed),
                                      name="boot-id-bind", daemon=True)
            worker.start()
            worker.join()
    except TemplateError as exc:
        raise OSError(str(exc)) from exc
    if failed:
        raise failed[0]


def _bind_in(namespace: int, failed: list[OSError]) -> None:
    """In a thread of its own, which ends with it: the container's mount namespace entered
    (its own view of the file system first, shared no more with the process's other
    threads), the bind made and made read-only. Only system calls happen here."""
    try:
        _call(_libc.unshare(_CLONE_FS), "unshare")
        _call(_libc.setns(namespace, _CLONE_NEWNS), "setns")
        target = PROC_BOOT_ID.encode()
        _call(_libc.mount(IN_SANDBOX.encode(), target, None, _MS_BIND, None), "bind")
        _call(_libc.mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID
                          | _MS_NODEV | _MS_NOEXEC, None), "remount")
    except OSError as exc:
        failed.append(exc)


def _call(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
