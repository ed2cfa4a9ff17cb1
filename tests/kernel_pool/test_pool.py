"""The warm pool: hand-off, refill, capacity, cancellation, orphans, culling.

Tests that need a pool of their own give it its own owner label (``OWNER-<suffix>``): a pool's
``start()`` removes every container of its owner, which must never reach the shared pool's.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
from kp_support import (
    PoolFactory,
    engine_actions,
    eventually,
    mounts_under,
    owned_containers,
    run_ok,
    sandbox_gone,
)

from kernel_pool import CapacityError, KernelPool, KernelStartError, PoolSettings, Profile
from kernel_pool._workspace import Workspace
from kernel_pool.backends.base import SandboxSpec
from kernel_pool.backends.docker import DockerBackend


def one_profile(**values: Any) -> dict[str, Profile]:
    return {"default": Profile(name="default", workspace_size="64m", tmp_size="32m", **values)}


def kernel_containers(client: docker.DockerClient, owner: str) -> list[str]:
    """The owner's containers that hold kernels: not the one that makes the workspace
    template, which the first pool of a run on a new image starts and removes meanwhile."""
    found = client.api.containers(all=True, filters={"label": f"io.replgate.owner={owner}"})
    return [c["Id"] for c in found
            if not c["Labels"].get("io.replgate.sandbox", "").startswith("template-")]


def consistent(pool: KernelPool, client: docker.DockerClient, owner: str) -> bool:
    """The pool counts every kernel container of ``owner``."""
    stats = pool.stats()
    return len(kernel_containers(client, owner)) == (stats["idle"] + stats["starting"]
                                                     + stats["in_use"])


async def test_acquire_hands_off_a_warm_kernel(pool: KernelPool) -> None:
    await pool.wait_ready()
    warm = pool._idle["default"][0]
    before = pool.stats()
    started = time.perf_counter()
    kernel = await pool.acquire()
    elapsed = time.perf_counter() - started
    try:
        assert kernel is warm
        assert elapsed < 0.05, f"a hand-off took {elapsed * 1000:.1f} ms"
        assert pool.stats()["in_use"] == before["in_use"] + 1
        # The refill starts shortly after the claim (REFILL_AFTER_CLAIM_S: not among a
        # burst's claims), and brings the idle count back to min_idle.
        assert "default" in pool._fill_handles
        await eventually(lambda: pool.stats()["starting"] >= 1, 2)
        await pool.wait_ready(timeout_s=60)
        assert pool.stats()["idle"] == 1
    finally:
        await pool.release(kernel)
    assert kernel.state == "closed"


async def test_idle_kernel_replaced_when_it_dies(pool: KernelPool,
                                                docker_client: docker.DockerClient) -> None:
    await pool.wait_ready()
    doomed = pool._idle["default"][0]
    await asyncio.to_thread(docker_client.api.kill, doomed.sandbox.info.container_id)
    await eventually(lambda: doomed not in pool._idle["default"], 10)
    await pool.wait_ready(timeout_s=60)
    assert pool._idle["default"][0] is not doomed
    await eventually(lambda: doomed.state == "closed", 10)
    await eventually(lambda: not doomed._closing or doomed._closing.done(), 30)
    assert await asyncio.to_thread(sandbox_gone, docker_client, doomed.sandbox.info) == []


async def test_acquire_raises_capacity_error_at_the_cap(own_pool: PoolFactory) -> None:
    # No wait for room: the one kernel is held by no session that could go idle and be paused.
    pool = own_pool("cap", max_kernels=1, capacity_wait_s=0, profiles=one_profile(min_idle=1))
    await pool.start()
    await pool.wait_ready()
    kernel = await pool.acquire()
    try:
        started = time.perf_counter()
        with pytest.raises(CapacityError) as caught:
            await pool.acquire()
        assert time.perf_counter() - started < 0.1, "at the cap the pool must fail fast"
        assert caught.value.limit == 1
        assert "REPLGATE_MAX_KERNELS" in str(caught.value)
        assert pool.stats() == {"idle": 0, "starting": 0, "in_use": 1, "sessions": 0,
                                "paused": 0, "max": 1, "memory_short": 0}
    finally:
        await pool.release(kernel)
    await eventually(lambda: pool.stats()["idle"] == 1)
    assert repr(pool) == "<KernelPool 1 idle, 0 starting, 0 in use, max 1>"


async def test_kernel_that_does_not_answer_is_tried_again_then_reported(
        own_pool: PoolFactory, docker_client: docker.DockerClient,
        caplog: pytest.LogCaptureFixture) -> None:
    # No kernel process answers within 0.2 s of its launch (Python alone starts slower). A
    # kernel restored from a template would: templates off, every kernel boots.
    pool = own_pool("mute", kernel_start_timeout_s=0.2, profiles=one_profile(min_idle=0),
                    kernel_templates=False)
    await pool.start()
    with caplog.at_level("WARNING", logger="kernel_pool"), \
            pytest.raises(KernelStartError) as caught:
        await pool.acquire()
    assert "no answer within 0.2s (nothing came back on any channel)" in str(caught.value)
    retries = [r.getMessage() for r in caplog.records if "trying again" in r.getMessage()]
    assert len(retries) == 1, retries
    assert retries[0].split(" did not start")[0] != str(caught.value).split(" did not start")[0]
    # Both sandboxes are gone, and the pool counts nothing.
    assert owned_containers(docker_client, pool.settings.owner) == []
    assert pool.stats()["starting"] == pool.stats()["in_use"] == 0


async def test_a_booted_kernel_is_launched_and_removed_with_no_signal_from_the_engine(
        own_pool: PoolFactory, docker_client: docker.DockerClient) -> None:
    # Templates off: the kernel boots, PID 1 starting it on SIGUSR1. Each signal the engine
    # sends is a `runc kill` (one more start of a Go program); the launch's and the removal's
    # go from the host, and the engine logs no kill at all.
    pool = own_pool("booted", profiles=one_profile(min_idle=0), kernel_templates=False)
    await pool.start()
    since = time.time() - 1
    session = await pool.create_session()
    await run_ok(session, "import subprocess; subprocess.Popen(['sleep', '600'])")
    container_id = session.kernel.sandbox.info.container_id
    assert not session.kernel.sandbox.from_template

    await pool.delete_session(session.id)

    actions = await asyncio.to_thread(engine_actions, docker_client, container_id, since)
    assert actions[:2] == ["create", "start"] and "die" in actions and "destroy" in actions, \
        actions
    assert not [action for action in actions if action.startswith("kill")], actions


async def test_slow_kernel_start_is_logged_with_its_steps(
        own_pool: PoolFactory, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # Every start counts as slow here: the warning must name the time each step took.
    monkeypatch.setattr("kernel_pool._kernel.SLOW_START_S", 0.0)
    pool = own_pool("slow", profiles=one_profile(min_idle=0))
    await pool.start()
    with caplog.at_level("WARNING", logger="kernel_pool"):
        kernel = await pool.acquire()
    await pool.release(kernel)
    slow = [r.getMessage() for r in caplog.records if "its start took" in r.getMessage()]
    assert len(slow) == 1, slow
    for step in ("reserving the workspace", "launching", "waiting for its first answer"):
        assert f"{step} " in slow[0], slow[0]


async def test_cancelled_acquire_leaves_pool_consistent(
        own_pool: PoolFactory, docker_client: docker.DockerClient) -> None:
    pool = own_pool("cancel", max_kernels=2, profiles=one_profile(min_idle=0))
    await pool.start()
    owner = pool.settings.owner
    waiter = asyncio.ensure_future(pool.acquire())
    await eventually(lambda: len(kernel_containers(docker_client, owner)) == 1, 30)
    assert pool.stats()["starting"] == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    # The start goes on; the kernel nobody waits for any more joins the idle set.
    await eventually(lambda: pool.stats()["idle"] == 1)
    assert pool.stats() == {"idle": 1, "starting": 0, "in_use": 0, "sessions": 0,
                            "paused": 0, "max": 2, "memory_short": 0}
    assert consistent(pool, docker_client, owner)
    started = time.perf_counter()
    kernel = await pool.acquire()
    assert time.perf_counter() - started < 0.05
    await pool.release(kernel)
    assert consistent(pool, docker_client, owner)


async def test_cancelled_create_session_leaks_nothing(
        own_pool: PoolFactory, docker_client: docker.DockerClient) -> None:
    pool = own_pool("cancel2", max_kernels=2, profiles=one_profile(min_idle=0))
    await pool.start()
    owner = pool.settings.owner
    for delay in (0.05, 0.3, 1.0):
        waiter = asyncio.ensure_future(pool.create_session(env={"A": "1"}))
        await asyncio.sleep(delay)
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
        await eventually(lambda: pool.stats()["starting"] == 0)
        stats = pool.stats()
        assert stats["in_use"] == len(pool.sessions)
        assert consistent(pool, docker_client, owner), stats
    for session_id in list(pool.sessions):
        await pool.delete_session(session_id)
    assert consistent(pool, docker_client, owner)


async def test_close_while_kernels_start_leaves_nothing(
        own_pool: PoolFactory, docker_client: docker.DockerClient) -> None:
    pool = own_pool("closing", max_kernels=2, profiles=one_profile(min_idle=2))
    await pool.start()
    await eventually(lambda: len(owned_containers(docker_client, pool.settings.owner)) >= 1, 30)
    await pool.close()
    assert owned_containers(docker_client, pool.settings.owner) == []
    assert mounts_under(pool.settings.state_dir) == []


async def test_start_removes_orphans(own_pool: PoolFactory,
                                     docker_client: docker.DockerClient) -> None:
    pool = own_pool("orphans", profiles=one_profile(min_idle=0))
    # A gateway that died left two sandboxes; the next one knows only the first's session.
    earlier = DockerBackend(pool.settings)
    profile = pool.settings.profiles["default"]
    kept = await earlier.create(SandboxSpec(sandbox_id=uuid.uuid4().hex[:12], profile=profile))
    orphan = await earlier.create(SandboxSpec(sandbox_id=uuid.uuid4().hex[:12], profile=profile))
    await earlier.close()

    taken_back = await pool.start(keep=lambda info: info.sandbox_id == kept.info.sandbox_id)

    assert [info.sandbox_id for info in taken_back] == [kept.info.sandbox_id]
    assert await asyncio.to_thread(sandbox_gone, docker_client, orphan.info) == []
    assert docker_client.api.inspect_container(kept.info.container_id)["State"]["Running"]
    await pool.backend.remove(taken_back[0])
    assert owned_containers(docker_client, pool.settings.owner) == []
    assert mounts_under(pool.settings.state_dir) == []


async def test_remove_leftovers_removes_a_half_made_sandbox_and_spares_the_sessions(
        own_pool: PoolFactory) -> None:
    pool = own_pool("leftovers", profiles=one_profile(min_idle=0))
    state = pool.settings.state_dir
    # A gateway killed while making a sandbox: its socket folder and workspace were made, and
    # mounted, but no container, which start() would have found it by.
    half = uuid.uuid4().hex[:12]
    await asyncio.to_thread(DockerBackend.make_socket_dir, state / "run" / half / "kernel")
    await asyncio.to_thread(Workspace.create, state / "workspaces" / half, 16 * 2**20)
    await pool.start()
    running = await pool.create_session()
    paused = await pool.create_session()
    await run_ok(paused, "open('kept.txt', 'w').write('kept')\nkept = 1")
    await paused.pause()

    await pool.remove_leftovers()

    assert mounts_under(state / "run" / half) == mounts_under(state / "workspaces" / half) == []
    ids = {s.sandbox_info().sandbox_id for s in (running, paused)}
    assert set(os.listdir(state / "run")) == ids
    assert set(os.listdir(state / "workspaces")) == ids | {f"{i}.ext4" for i in ids}
    await paused.resume()
    assert await run_ok(paused, "print(open('kept.txt').read(), kept)") == "kept 1\n"
    assert await run_ok(running, "print(2)") == "2\n"
    for session in (running, paused):
        await pool.delete_session(session.id)


async def test_a_removal_that_fails_is_logged_once_and_tried_again(
        own_pool: PoolFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pool = own_pool("unremoved", cull_interval_s=0.2, profiles=one_profile(min_idle=0))
    await pool.start()
    kernel = await pool.acquire()
    sandbox_id = kernel.sandbox.info.sandbox_id
    image = Path(kernel.sandbox.info.workspace).with_suffix(".ext4")
    # Something mounted on the workspace's image (a host's backup tool, say): it cannot be
    # deleted while that lasts, so the removal fails for real.
    cover = tmp_path / "cover"
    cover.touch()
    await asyncio.to_thread(subprocess.run, ["mount", "--bind", str(cover), str(image)],
                            check=True)
    try:
        with caplog.at_level("WARNING"):
            pool.give_back(kernel)  # removed in the background
            await eventually(lambda: any("failed again" in r.getMessage()
                                         for r in caplog.records), 30)
            gc.collect()  # a task whose failure nobody retrieved is reported when collected
    finally:
        await asyncio.to_thread(subprocess.run, ["umount", str(image)], check=True)
    # The cull loop's next try; the socket folder is the last thing a removal removes.
    sockets = pool.settings.state_dir / "run" / sandbox_id
    await eventually(lambda: not sockets.exists(), 30)
    assert not image.exists() and mounts_under(pool.settings.state_dir) == []
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    assert f"kernel {kernel.id}: removing its sandbox {sandbox_id} failed" in errors[0]
    assert "Device or resource busy" in errors[0]


async def test_cull_closes_idle_sessions(own_pool: PoolFactory) -> None:
    pool = own_pool("cull", idle_ttl_s=1.0, cull_interval_s=0.2,
                    profiles=one_profile(min_idle=0))
    closed: list[tuple[str, str]] = []
    pool.on_session_closed.append(lambda session, reason: closed.append((session.id, reason)))
    await pool.start()
    session = await pool.create_session()
    await run_ok(session, "1")
    await eventually(lambda: bool(closed), 10)
    assert closed == [(session.id, "idle for more than 1s")]
    assert pool.stats()["sessions"] == 0 and pool.stats()["in_use"] == 0


async def test_resume_while_the_pool_refills_takes_the_refilled_kernel(
        own_pool: PoolFactory) -> None:
    # The warm kernel the session took is being replaced when it resumes: the resume waits
    # for that one (its sandbox changes) instead of booting a container of its own beside it.
    pool = own_pool("handoff", profiles=one_profile(min_idle=1))
    await pool.start()
    await pool.wait_ready(timeout_s=120)
    session = await pool.create_session()
    await run_ok(session, "kept = 7")
    first = session.kernel.id
    await session.pause()
    # The claim's refill is under way, or due (REFILL_AFTER_CLAIM_S): the resume starts it.
    assert pool.stats()["idle"] == 0
    assert pool.stats()["starting"] == 1 or "default" in pool._fill_handles
    await session.resume()
    result = await session.execute("kept * 6")
    assert result.outputs[-1].data["text/plain"] == "42"
    assert session.kernel.id != first
    await pool.delete_session(session.id)


def test_settings_refuse_unsafe_sizes() -> None:
    with pytest.raises(ValueError, match="size"):
        Profile(memory="lots")
    with pytest.raises(ValueError):
        PoolSettings(state_dir=Path("/tmp/x"), max_kernels=0)
