"""The loopback of a sandbox the engine restored whole, brought up again.

Sandboxes are made with the engine's networking disabled (``_containers.HOSTS`` says why):
their network namespace is runc's own, not one the engine keeps, so a whole-container
checkpoint dumps it with the processes and CRIU makes it again on restore, with its loopback
down and no address. Code contexts reach their kernels over TCP on ``127.0.0.1`` (Deno's
kernel, through ``replgate_kernel/relay.py``): the restored connections would stall and a new
kernel could not be reached. Bringing the interface up gives it its addresses back (the
kernel adds them to a loopback that comes up) and the held connections resume (TCP sends
again what was lost meanwhile). A kernel tree restored into a running container, or a
kernel template, meets the container's own namespace: nothing to do there.
"""

from __future__ import annotations

import ctypes
import fcntl
import socket
import struct
import threading

from kernel_pool.backends.docker._template import TemplateError, entered
from kernel_pool.exceptions import BackendError

CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS = 0x8913, 0x8914
IFF_UP = 0x1
IFREQ = "16sH22x"
"""``struct ifreq``: the interface's name, then its flags in a 24-byte union."""


def bring_loopback_up(init_pid: int, container_id: str) -> None:
    """Bring up the loopback of the container ``container_id``, whose PID 1 is host pid
    ``init_pid`` (blocking). The namespace is entered by a thread of its own, which ends
    after: no thread that serves anything else ever runs in a sandbox's namespace."""
    failed: list[OSError] = []
    try:
        with entered(init_pid, container_id, ("net",)) as (_, (netns,), _):
            worker = threading.Thread(target=_up, args=(netns, failed), name="replgate-loopback")
            worker.start()
            worker.join()
    except TemplateError as exc:
        raise BackendError(f"the restored sandbox's loopback could not be reached: {exc}") from exc
    if failed:
        raise BackendError(f"the restored sandbox's loopback could not be brought up: "
                           f"{failed[0]}")


def _up(netns: int, failed: list[OSError]) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(netns, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns into the sandbox's network namespace")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            asked = fcntl.ioctl(probe, SIOCGIFFLAGS, struct.pack(IFREQ, b"lo", 0))
            flags = struct.unpack(IFREQ, asked)[1]
            if not flags & IFF_UP:
                fcntl.ioctl(probe, SIOCSIFFLAGS, struct.pack(IFREQ, b"lo", flags | IFF_UP))
    except OSError as exc:
        failed.append(exc)
