"""This machine's memory: how much it has, and how much is available now."""

from __future__ import annotations

import os


def machine_memory() -> int:
    """Bytes of memory this machine has (4 GiB where it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 4 * 1024**3


def memory_available() -> int | None:
    """Bytes of memory available now for new work without swapping (Linux's MemAvailable:
    free memory and the page cache it can take back), None where it cannot be read. A read of
    a small procfs file: cheap enough for the event loop."""
    try:
        with open("/proc/meminfo", "rb") as meminfo:
            for line in meminfo:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
