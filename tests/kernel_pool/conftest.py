"""Fixtures for the kernel pool's tests: one real pool on the real engine, shared by the suite.

Every container these tests make carries ``io.replgate.owner=<OWNER>``, a label unique to this
run, so nothing here touches another run's containers, and the session's teardown proves that
none of ours remains. The state dir sits under ``/tmp`` with a short name: the kernels' ZMQ
sockets are Unix sockets, whose paths must stay short.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from kp_support import (
    OWNER,
    SESSION_ENV,
    PoolFactory,
    make_settings,
    mounts_under,
    owned_containers,
)

from kernel_pool import KernelPool, Session
from tests.conftest import unmount_all


@pytest.fixture(scope="session")
def state_root(docker_client: docker.DockerClient) -> Iterator[Path]:
    """A short state dir for the run; afterwards no container, mount or file of ours remains."""
    root = Path(tempfile.mkdtemp(prefix="rg-test-", dir="/tmp"))
    yield root
    left = owned_containers(docker_client)
    for container_id in left:
        docker_client.api.remove_container(container_id, force=True, v=True)
    mounted = unmount_all(root)
    shutil.rmtree(root, ignore_errors=True)
    assert not left, f"the tests left containers behind: {left}"
    assert not mounted, f"the tests left workspaces mounted: {mounted}"


@pytest.fixture(scope="session")
async def pool(state_root: Path) -> AsyncIterator[KernelPool]:
    """The suite's shared pool: one warm ``default`` kernel kept ready."""
    kernel_pool = KernelPool(make_settings(state_root / "shared"))
    try:
        await kernel_pool.start()
        await kernel_pool.wait_ready(timeout_s=120)
        yield kernel_pool
    finally:
        await kernel_pool.close()


@pytest.fixture(scope="session")
async def shared_session(pool: KernelPool) -> AsyncIterator[Session]:
    """A session for tests whose state does not matter to the others (nothing restarts it)."""
    session = await pool.create_session(env=SESSION_ENV)
    yield session
    await pool.delete_session(session.id)


@pytest.fixture
async def session(pool: KernelPool) -> AsyncIterator[Session]:
    """A session of its own, for tests that restart, kill or fill the kernel."""
    own = await pool.create_session()
    yield own
    if not own.closed:
        await pool.delete_session(own.id)


@pytest.fixture
async def small_session(pool: KernelPool) -> AsyncIterator[Session]:
    """A session with a 384 MiB memory limit, for out-of-memory tests."""
    own = await pool.create_session("small")
    yield own
    if not own.closed:
        await pool.delete_session(own.id)


@pytest.fixture
async def own_pool(state_root: Path, docker_client: docker.DockerClient,
                   ) -> AsyncIterator[PoolFactory]:
    """Make pools with their own owner and state; each is closed, and proven empty, after."""
    made: list[KernelPool] = []

    def make(suffix: str, **overrides: Any) -> KernelPool:
        owner = f"{OWNER}-{suffix}"
        settings = make_settings(state_root / suffix, owner=owner, **overrides)
        pool = KernelPool(settings)
        made.append(pool)
        return pool

    yield make
    for pool in made:
        await pool.close()
        assert owned_containers(docker_client, pool.settings.owner) == []
        assert mounts_under(pool.settings.state_dir) == []
