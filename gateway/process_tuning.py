"""What a long-running replgate process (a gateway, a node) sets in itself at its start: how
glibc's malloc gives memory back, and how many files it may open."""

from __future__ import annotations

import contextlib
import ctypes
import resource


def tune_process() -> None:
    """Both settings below, for a gateway or a node about to serve."""
    return_large_buffers()
    raise_open_files_limit()


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
"""glibc's mallopt parameters (malloc.h)."""


def return_large_buffers() -> None:
    """Have glibc's malloc give buffers of 1 MiB and more back to the system when freed.

    By default it raises its mmap threshold to the size of the largest buffer freed (up to
    32 MiB): after one large output, every later one of that size comes from the heap, whose
    freed pages stay in the process and pile up. Measured with a WebSocket client that reads
    nothing while six executions each display 16 MB: the gateway's RSS rose 320-370 MiB, and
    160-210 MiB with the threshold fixed (two runs each). Not lower than 1 MiB: asyncio's TLS
    reads take a 256 KiB buffer each, and mapping it afresh every time cost 100 us per round
    trip (measured; the node hop's p50 rose by 1-2 ms). Elsewhere than glibc, nothing happens.
    """
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_THRESHOLD, 1024 * 1024)
    mallopt(M_TRIM_THRESHOLD, 4 * 1024 * 1024)


OPEN_FILES_CEILING = 1 << 20
"""The soft limit of open files asked for where the hard one is unlimited (Linux's default
``nr_open``, above which no limit may be set)."""


def raise_open_files_limit() -> None:
    """Raise this process's soft limit of open files to its hard limit.

    Each running kernel holds about ten descriptors here (its ZMQ sockets, its sandbox's
    pidfd): 9.6 a session, measured over twenty. The soft limit many systems start services
    with, 1024, would refuse a hundred sessions' sockets; the hard one is the operator's
    word, and raising to it needs no privilege. Processes started from here inherit it.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = OPEN_FILES_CEILING if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
