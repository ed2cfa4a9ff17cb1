"""A session's sandbox use now, against its limits (:meth:`Session.usage`)."""

from __future__ import annotations

import anyio.to_thread
from pydantic import BaseModel

from kernel_pool._workspace import Workspace
from kernel_pool.backends.base import Sandbox
from kernel_pool.config import Profile, parse_size


class SandboxUsage(BaseModel):
    """Raw readings: a CPU percentage needs two of them (``cpu_ns`` is a running total)."""

    cpu_ns: int | None
    """CPU time the sandbox's processes used since it started; None while paused or where
    the backend cannot read it. A new sandbox (a resume) starts again from 0."""
    cpus: float
    """The sandbox's CPU limit, in CPUs."""
    memory_bytes: int
    """Memory in use (page cache included, as the limit counts it); 0 while paused."""
    memory_limit_bytes: int
    disk_used_bytes: int
    """What the workspace's files hold on disk (an estimate while paused)."""
    disk_limit_bytes: int
    paused: bool


async def read_usage(sandbox: Sandbox, workspace: Workspace, profile: Profile,
                     paused: bool) -> SandboxUsage:
    """The readings of a session's sandbox (``paused``: no cgroup is read, it has none)."""
    disk = await anyio.to_thread.run_sync(workspace.used_bytes)
    cgroup = None if paused else await sandbox.usage()
    return SandboxUsage(
        cpu_ns=cgroup.cpu_ns if cgroup is not None else None, cpus=profile.cpus,
        memory_bytes=(cgroup.memory_bytes or 0) if cgroup is not None else 0,
        memory_limit_bytes=parse_size(profile.memory), disk_used_bytes=disk,
        disk_limit_bytes=parse_size(profile.workspace_size), paused=paused)
