"""A kernel pool a test module starts for itself with profiles of its own: small sandboxes,
and a clean-up that removes what the pool left and fails the module if it left anything."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import docker

from kernel_pool import KernelPool, PoolSettings, Profile
from kernel_pool._broker import SecretLookup
from tests.conftest import containers_of, unmount_all


def small_profile(name: str, **fields: Any) -> Profile:
    """A profile of small sandboxes (no warm kernel unless ``min_idle`` says so)."""
    return Profile.model_validate({
        "name": name, "min_idle": 0, "memory": "1g", "workspace_size": "64m",
        "tmp_size": "32m", "pids": 128, "default_timeout_s": 30, "max_timeout_s": 60, **fields})


@asynccontextmanager
async def started_pool(docker_client: docker.DockerClient, settings: PoolSettings, *,
                       secret_source: Callable[[str], SecretLookup] | None = None,
                       ) -> AsyncIterator[KernelPool]:
    """A started pool; on the way out it is closed, its containers, mounts and state folder
    removed, and what it left behind is an assertion error."""
    pool = KernelPool(settings)
    pool.secret_source = secret_source
    try:
        await pool.start()
        yield pool
    finally:
        await pool.close()
        left = containers_of(docker_client, settings.owner)
        for container_id in left:
            docker_client.api.remove_container(container_id, force=True, v=True)
        mounted = unmount_all(settings.state_dir)
        shutil.rmtree(settings.state_dir, ignore_errors=True)
        assert not left, f"the pool left containers behind: {left}"
        assert not mounted, f"the pool left workspaces mounted: {mounted}"
