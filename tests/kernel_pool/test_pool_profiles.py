"""Profiles added to a running pool (a custom template's, one per build): it fills to the new
profile's ``min_idle``, hands its warm kernel out, drops its idle kernels when shrunk to none or
rebuilt on another image, and forgets it while its sessions run on."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest
from kp_support import OWNER, eventually, make_settings, owned_containers, run_ok

from kernel_pool import KernelPool, Profile, ProfileNotFound
from kernel_pool.backends.docker import current_image, slim_image


@pytest.fixture
async def pool(state_root: Path, docker_client: docker.DockerClient) -> AsyncIterator[KernelPool]:
    owner = f"{OWNER}-profiles"
    made = KernelPool(make_settings(state_root / "profiles", owner=owner, profiles={
        "default": Profile(name="default", min_idle=0, workspace_size="64m", tmp_size="32m")}))
    await made.start()
    yield made
    await made.close()
    assert owned_containers(docker_client, owner) == []


async def test_a_profile_added_while_running_fills_serves_and_is_forgotten(
        pool: KernelPool) -> None:
    extra = Profile(name="tpl_x-1", image=slim_image(), min_idle=1, workspace_size="64m",
                    tmp_size="32m")
    with pytest.raises(ProfileNotFound):
        pool.profile("tpl_x-1")
    pool.set_profile(extra)
    await pool.wait_ready(timeout_s=120)
    assert pool.stats()["idle"] == 1
    session = await pool.create_session("tpl_x-1", tenant="t")
    assert session.profile.image == slim_image()
    assert await run_ok(session, "print(6 * 7)") == "42\n"
    await pool.wait_ready(timeout_s=120)  # refilled: the profile keeps one warm kernel

    pool.set_profile(extra.model_copy(update={"min_idle": 0}))  # unused: no warm kernel
    await eventually(lambda: pool.stats()["idle"] == 0 and pool.stats()["starting"] == 0)

    pool.set_profile(extra.model_copy(update={"image": current_image()}))  # rebuilt
    await pool.wait_ready(timeout_s=120)
    pool.remove_profile("tpl_x-1")
    with pytest.raises(ProfileNotFound):
        pool.profile("tpl_x-1")
    await eventually(lambda: pool.stats()["idle"] == 0)
    assert await run_ok(session, "print('still here')") == "still here\n"  # runs on
    await pool.delete_session(session.id)
