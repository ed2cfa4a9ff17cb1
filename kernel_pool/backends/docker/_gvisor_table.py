"""gVisor's process table, as ``runsc ps`` or its control socket gives it (``pid -> parent
pid``, the sandbox's own pids): which processes are strays to kill after an execution, which
are the kernel's descendants, which its profile's service."""

from __future__ import annotations

from collections.abc import Mapping


def strays_of(processes: Mapping[int, int], keep_kernel_children: bool,
              spared: frozenset[int] = frozenset()) -> list[int]:
    """The pids to kill among ``pid -> parent pid`` (see :meth:`Runsc.kill_strays`)."""
    roots = {pid for pid, parent in processes.items() if parent == 0}
    strays = []
    for pid in processes:
        if pid in roots:
            continue
        if keep_kernel_children and _descends(pid, roots, processes):
            continue
        if spared and (pid in spared or _descends(pid, set(spared), processes)):
            continue
        strays.append(pid)
    return strays


def service_of(processes: Mapping[int, int]) -> list[int]:
    """The children of the processes the engine started but PID 1, among ``pid -> parent
    pid``: when a kernel has just answered first, those of its profile's service (gVisor
    tells no sessions; no command runs yet)."""
    roots = {pid for pid, parent in processes.items() if parent == 0} - {1}
    return [pid for pid, parent in processes.items() if parent in roots]


def kernel_descendants(processes: Mapping[int, int]) -> set[int]:
    """The descendants of the processes the engine started but PID 1 (the kernel's, a
    command's) among ``pid -> parent pid``."""
    roots = {pid for pid, parent in processes.items() if parent == 0}
    return {pid for pid in processes
            if pid not in roots and _descends(pid, roots, processes)}


def _descends(pid: int, roots: set[int], processes: Mapping[int, int]) -> bool:
    for _ in range(len(processes) + 1):
        pid = processes.get(pid, 0)
        if pid in roots:
            return pid != 1  # PID 1 adopts orphans: daemons re-parented there are strays
        if pid == 0:
            return False
    return False
