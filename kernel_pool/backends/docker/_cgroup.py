"""Read a container's cgroup from the host: CPU time, memory, peak memory, OOM kills.

Works with cgroup v1 (memory and cpuacct controllers) and v2 (unified). Where the files are
not readable (a remote engine, rootless Docker) every reading is None, never an error.
"""

from __future__ import annotations

import os
from pathlib import Path

from kernel_pool.backends.base import CgroupUsage

CGROUP_ROOT = Path("/sys/fs/cgroup")


def read_pseudo_file(path: str | Path) -> bytes:
    """A small kernel pseudo-file, read with bare system calls: they are read several times
    per execution, and ``Path.read_text`` costs twice as much (a text wrapper each time)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 1 << 16)
    finally:
        os.close(fd)


def _read_int(path: str | None) -> int | None:
    if path is None:
        return None
    try:
        return int(read_pseudo_file(path).split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_key(path: str | None, key: str) -> int | None:
    if path is None:
        return None
    try:
        for line in read_pseudo_file(path).decode().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def procs_files(proc_cgroup: str) -> list[Path]:
    """The ``cgroup.procs`` file of each hierarchy a ``/proc/PID/cgroup`` text names (v1
    controllers, and v2 alone or beside them as ``unified``) that is found on this host."""
    found = []
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers:
            candidates = [CGROUP_ROOT / controllers.removeprefix("name=")]
        else:
            candidates = [CGROUP_ROOT / "unified", CGROUP_ROOT]
        for base in candidates:
            procs = base / path.lstrip("/") / "cgroup.procs"
            if procs.is_file():
                found.append(procs)
                break
    return found


class CgroupReader:
    """The cgroup files of one container, located once from its init's host pid."""

    def __init__(self, memory: Path | None, cpu: Path | None, unified: bool) -> None:
        self.memory = memory
        self.cpu = cpu
        self.unified = unified
        # Every execution reads these twice: their paths are joined once, here.
        memory_files = (("memory.current", "memory.peak", "memory.events", "cpu.stat")
                        if unified else ("memory.usage_in_bytes", "memory.max_usage_in_bytes",
                                         "memory.oom_control"))
        self._files: dict[str, str] = {name: f"{memory}/{name}" for name in memory_files
                                       if memory is not None}
        if cpu is not None and not unified:
            self._files["cpuacct.usage"] = f"{cpu}/cpuacct.usage"

    @classmethod
    def for_pid(cls, pid: int) -> CgroupReader | None:
        if pid <= 0:
            return None
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            return None
        paths: dict[str, str] = {}
        for line in lines:
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller] = path.lstrip("/")
        if "memory" in paths:
            memory = CGROUP_ROOT / "memory" / paths["memory"]
            cpu = CGROUP_ROOT / "cpuacct" / paths.get("cpuacct", paths["memory"])
            return cls(memory if memory.is_dir() else None, cpu if cpu.is_dir() else None, False)
        if "" in paths:
            unified = CGROUP_ROOT / paths[""]
            return cls(unified, unified, True) if unified.is_dir() else None
        return None

    def read(self) -> CgroupUsage:
        files = self._files
        if self.unified:
            usage_us = _read_key(files.get("cpu.stat"), "usage_usec")
            return CgroupUsage(
                cpu_ns=usage_us * 1000 if usage_us is not None else None,
                memory_bytes=_read_int(files.get("memory.current")),
                peak_memory_bytes=_read_int(files.get("memory.peak")),
                oom_kills=_read_key(files.get("memory.events"), "oom_kill"),
            )
        return CgroupUsage(
            cpu_ns=_read_int(files.get("cpuacct.usage")),
            memory_bytes=_read_int(files.get("memory.usage_in_bytes")),
            peak_memory_bytes=_read_int(files.get("memory.max_usage_in_bytes")),
            oom_kills=_read_key(files.get("memory.oom_control"), "oom_kill"),
        )

    @property
    def procs_file(self) -> Path | None:
        """The file listing the host pids of every process in the container."""
        return self.memory / "cgroup.procs" if self.memory is not None else None

    def reset_peak(self) -> bool:
        """Restart the peak reading so it covers one execution (v1, or v2 on Linux 6.12+)."""
        if self.memory is None:
            return False
        target = self._files["memory.peak" if self.unified else "memory.max_usage_in_bytes"]
        try:
            fd = os.open(target, os.O_WRONLY)
            try:
                os.write(fd, b"0\n")
            finally:
                os.close(fd)
        except OSError:
            return False
        return True
