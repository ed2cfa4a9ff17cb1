"""Helpers for the kernel pool's tests (a module of its own: conftest is not importable)."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import docker
import docker.errors

from kernel_pool import KernelPool, PoolSettings, Profile, SandboxInfo, Session
from kernel_pool.backends.docker import LABEL_OWNER
from tests.conftest import TEMPLATE_DIR
from tests.conftest import mounts_under as mounts_under

PoolFactory = Callable[..., Any]
"""The ``own_pool`` fixture: ``own_pool(suffix, **settings)`` makes a pool of its own."""

OWNER = f"kptest-{secrets.token_hex(4)}"
"""The owner label of this run's containers; pools of their own use ``OWNER-<suffix>``."""

SESSION_ENV = {"REPLGATE_TEST_GREETING": "hello from the session"}
"""The environment the shared session asks for."""


def profiles_for_tests() -> dict[str, Profile]:
    """Small limits, so limit tests are quick: ``default`` kept warm; ``small`` (384 MiB of
    memory, a 64 MiB workspace) started on demand for the out-of-memory and full-disk tests.
    Both run under the run's runtime (``REPLGATE_TEST_RUNTIME``: runc or gvisor)."""
    runtime = os.environ.get("REPLGATE_TEST_RUNTIME", "runc")
    return {
        "default": Profile(name="default", min_idle=1, memory="1g", workspace_size="256m",
                           tmp_size="32m", pids=128, default_timeout_s=30, max_timeout_s=120,
                           runtime=runtime),
        "small": Profile(name="small", min_idle=0, memory="384m", workspace_size="64m",
                         tmp_size="32m", pids=128, default_timeout_s=30, max_timeout_s=120,
                         runtime=runtime),
    }


def pause_profiles() -> dict[str, Profile]:
    """Small runc and gVisor profiles with no warm kernels, for pools that pause sessions."""
    return {"default": Profile(name="default", workspace_size="64m", tmp_size="32m",
                               min_idle=0),
            "hostile": Profile(name="hostile", runtime="gvisor", workspace_size="64m",
                               tmp_size="32m", min_idle=0)}


def make_settings(state_dir: Path, **overrides: Any) -> PoolSettings:
    values: dict[str, Any] = {
        "state_dir": state_dir, "owner": OWNER, "profiles": profiles_for_tests(), "max_kernels": 8,
        "interrupt_grace_s": 2.0, "max_queued_executions": 4, "kernel_start_timeout_s": 60.0,
        "template_dir": TEMPLATE_DIR,
    }
    values.update(overrides)
    return PoolSettings(**values)


def engine_actions(docker_client: docker.DockerClient, container_id: str,
                   since: float) -> list[str]:
    """What the engine did to the container from ``since`` on, as its event log says: each
    action's name, a kill's with its signal's number (``kill 9``)."""
    events = docker_client.api.events(since=int(since), until=int(time.time()) + 1, decode=True,
                                      filters={"type": "container", "container": container_id})
    return [" ".join([event["Action"].split(":")[0],
                      *([event["Actor"]["Attributes"]["signal"]]
                        if "signal" in event["Actor"].get("Attributes", {}) else [])])
            for event in events]


def owned_containers(client: docker.DockerClient, owner: str = OWNER) -> list[str]:
    """Containers labelled with ``owner`` or, for the run's own, any ``OWNER-*`` of this run."""
    found = client.api.containers(all=True, filters={"label": LABEL_OWNER})
    return [c["Id"] for c in found
            if (label := c["Labels"].get(LABEL_OWNER, "")) == owner
            or (owner == OWNER and label.startswith(f"{OWNER}-"))]


@asynccontextmanager
async def pausing_pool(state_root: Path, docker_client: docker.DockerClient, name: str,
                       profiles: dict[str, Profile] | None = None,
                       **settings: Any) -> AsyncIterator[KernelPool]:
    """A started pool of its own (owner and state folder named by ``name``) on ``profiles``
    (the small :func:`pause_profiles` by default); after it closes, no container or mount of
    it may be left."""
    owner = f"{OWNER}-{name}"
    pool = KernelPool(make_settings(state_root / name, owner=owner,
                                    profiles=profiles or pause_profiles(), **settings))
    await pool.start()
    try:
        yield pool
    finally:
        await pool.close()
    assert owned_containers(docker_client, owner) == []
    assert mounts_under(pool.settings.state_dir) == []


@asynccontextmanager
async def own_session(pool: KernelPool) -> AsyncIterator[Session]:
    """A session of ``pool``'s default profile, deleted after."""
    session = await pool.create_session()
    try:
        yield session
    finally:
        await pool.delete_session(session.id)


async def run_ok(session: Session, code: str, timeout_s: float | None = None) -> str:
    """Run ``code``; it must succeed. Its stdout."""
    result = await session.execute(code, timeout_s)
    assert result.status == "ok", (result.status, result.error, result.reason, result.stderr)
    return result.stdout


PROCESSES = """
import os
for _pid in sorted(p for p in os.listdir('/proc') if p.isdigit()):
    try:
        with open(f'/proc/{_pid}/cmdline', 'rb') as _f:
            _cmd = _f.read().replace(b'\\0', b' ').decode().strip()
        with open(f'/proc/{_pid}/stat') as _f:
            _state = _f.read().rsplit(')', 1)[1].split()[0]
    except OSError:
        continue
    print(_pid, _state, _cmd)
"""


async def processes(session: Session) -> list[tuple[int, str, str]]:
    """(pid, state, command line) of every process in the session's container."""
    found = []
    for line in (await run_ok(session, PROCESSES)).splitlines():
        pid, state, *cmd = line.split(" ", 2)
        found.append((int(pid), state, cmd[0] if cmd else ""))
    return found


async def eventually(check: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Wait until ``check()`` holds (the pool offers no event for most of these states)."""
    async with asyncio.timeout(timeout_s):
        while not check():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


def sandbox_gone(client: docker.DockerClient, info: SandboxInfo) -> list[str]:
    """What is left of a removed sandbox (blocking): an empty list when nothing is."""
    left = []
    try:
        client.api.inspect_container(info.container_id)
        left.append(f"container {info.container_id}")
    except docker.errors.NotFound:
        pass
    image = Path(info.workspace).with_suffix(".ext4")
    left += [str(p) for p in (Path(info.workspace), image, Path(info.socket_dir)) if p.exists()]
    left += [f"mount {m}" for m in mounts_under(Path(info.workspace))]
    loops = subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True)
    left += [f"loop {line}" for line in loops.stdout.splitlines()]
    return left


def is_mounted(path: Path) -> bool:
    return os.path.ismount(path)
