"""The warm pool's size, its kernels frozen while they wait, and turns to start kernels.

Pools of their own, as in ``test_pool.py``: each with its own owner label.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import docker
import pytest
from kp_support import (
    PoolFactory,
    engine_actions,
    eventually,
    run_ok,
)

from kernel_pool import PoolSettings, Profile
from kernel_pool._pool_base import warm_sizes
from kernel_pool._turns import Turns
from kernel_pool.config import default_min_idle


def _profile(name: str, **values: Any) -> Profile:
    return Profile(name=name, workspace_size="64m", tmp_size="32m", **values)


def test_default_warm_size_follows_the_machine() -> None:
    # Ten per core, at most two thirds of the running-kernel cap, at least one.
    assert default_min_idle(37, cpus=2) == 20
    assert default_min_idle(12, cpus=2) == 8
    assert default_min_idle(256, cpus=64) == 170
    assert default_min_idle(2, cpus=1) == 1
    # Profiles that leave min_idle unset share it; a profile's own min_idle is kept.
    settings = PoolSettings(state_dir=Path("/tmp/unused"), max_kernels=37, profiles={
        "a": _profile("a"), "b": _profile("b"), "c": _profile("c", min_idle=3)})
    share = default_min_idle(37) // 2
    assert warm_sizes(settings) == {"a": max(1, share), "b": max(1, share), "c": 3}
    assert warm_sizes(PoolSettings(state_dir=Path("/tmp/unused"), max_kernels=2)) == {
        "default": 1}


def _freezer_state(kernel: Any) -> str:
    freezer = kernel.sandbox.freezer
    assert freezer is not None, "the host cannot write the container's freezer"
    return Path(freezer._state).read_text().strip()


async def test_warm_kernels_wait_frozen_and_run_when_taken(own_pool: PoolFactory) -> None:
    pool = own_pool("frozen", max_kernels=4, profiles={"default": _profile("default",
                                                                           min_idle=2)})
    await pool.start()
    await pool.wait_ready(timeout_s=120)
    warm = list(pool._idle["default"])
    assert len(warm) == 2
    # FREEZING until every task has stopped (one may still run a moment): measured once FROZEN.
    await eventually(lambda: all(kernel.sandbox.freezer._frozen() is True for kernel in warm),
                     10)
    before = [(await k.sandbox.usage()).cpu_ns for k in warm]
    await asyncio.sleep(1.0)
    assert [(await k.sandbox.usage()).cpu_ns for k in warm] == before, "a frozen kernel ran"
    started = time.perf_counter()
    session = await pool.create_session()
    await run_ok(session, "x = 1 + 1")
    took = time.perf_counter() - started
    assert session.kernel in warm
    assert _freezer_state(session.kernel) == "THAWED"
    assert took < 5, f"a warm kernel took {took:.2f} s to answer"
    await pool.delete_session(session.id)


async def test_a_frozen_warm_kernel_is_ended_from_the_host_and_removed(
        own_pool: PoolFactory, docker_client: docker.DockerClient) -> None:
    # A frozen task takes a SIGKILL only once thawed: the removal's kill from the host thaws
    # after it, or the engine would wait for an exit that never comes and stop it itself.
    pool = own_pool("frozen-removal", max_kernels=2, profiles={"default": _profile(
        "default", min_idle=1)})
    await pool.start()
    await pool.wait_ready(timeout_s=120)
    (kernel,) = pool._idle["default"]
    await eventually(lambda: kernel.sandbox.freezer._frozen() is True, 10)
    container_id = kernel.sandbox.info.container_id
    since = time.time() - 1

    await pool.close()

    actions = await asyncio.to_thread(engine_actions, docker_client, container_id, since)
    assert "die" in actions and "destroy" in actions, actions
    assert not [action for action in actions if action.startswith("kill")], actions


async def test_a_session_at_the_limit_takes_a_warm_kernels_slot(own_pool: PoolFactory) -> None:
    # Every slot holds a frozen warm kernel of another profile: the session's kernel takes
    # one's slot at once (no wait for room: capacity_wait_s is 0).
    pool = own_pool("reclaim", max_kernels=2, capacity_wait_s=0,
                    profiles={"default": _profile("default", min_idle=0),
                              "other": _profile("other", min_idle=2)})
    await pool.start()
    await pool.wait_ready(timeout_s=120)
    assert len(pool._idle["other"]) == 2
    session = await pool.create_session("default")
    await run_ok(session, "1")
    assert len(pool._idle["other"]) == 1 and pool.stats()["in_use"] == 1
    await pool.delete_session(session.id)


async def test_a_kernel_started_for_a_session_holds_its_slot_until_handed_over(
        own_pool: PoolFactory) -> None:
    # Between the start's end and the session's taking the kernel, the event loop runs
    # others: were the kernel counted neither starting nor in use then, a second request
    # would find the slot free and start a kernel past max_kernels (CI saw four of three).
    pool = own_pool("handover", max_kernels=1, capacity_wait_s=0,
                    profiles={"default": _profile("default", min_idle=0)})
    await pool.start()
    creating = asyncio.create_task(pool.create_session("default"))
    await eventually(lambda: pool.stats()["starting"] == 1, timeout_s=30)
    counted = []
    while not creating.done():
        stats = pool.stats()
        counted.append(stats["idle"] + stats["starting"] + stats["in_use"])
        await asyncio.sleep(0)
    session = creating.result()
    assert len(counted) > 10 and set(counted) == {1}, Counter(counted)
    await run_ok(session, "1")
    await pool.delete_session(session.id)


async def test_a_sessions_start_takes_the_next_turn_before_refills() -> None:
    turns = Turns(1)
    order: list[str] = []

    async def start(name: str, urgent: bool) -> None:
        async with turns.turn(urgent):
            order.append(name)
            await asyncio.sleep(0.01)

    async with turns.turn(urgent=False):  # a refill's start under way
        refills = [asyncio.create_task(start(f"refill {i}", False)) for i in range(3)]
        await asyncio.sleep(0)
        session = asyncio.create_task(start("session", True))
        await asyncio.sleep(0)
        assert repr(turns) == "<Turns 1/1 held, 1 urgent and 3 later waiting>"
    await asyncio.gather(session, *refills)
    assert order == ["session", "refill 0", "refill 1", "refill 2"]


async def test_a_cancelled_wait_for_a_turn_passes_it_on() -> None:
    turns = Turns(1)
    async with turns.turn(urgent=True):
        waiting = asyncio.create_task(turns._take(urgent=True))
        later = asyncio.create_task(turns._take(urgent=False))
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.sleep(0)
    await asyncio.wait_for(later, 1)  # the turn went to the one still waiting
    turns._give()
    assert repr(turns) == "<Turns 0/1 held, 0 urgent and 0 later waiting>"


async def test_the_refill_waits_for_the_sessions_starting_their_own_kernels(
        own_pool: PoolFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # Both warm kernels taken, a third session starts a kernel of its own: a refill's start
    # beside it would take the CPU it waits for (in a burst of a hundred, the refill's twenty
    # restores came as the last sessions' were under way, fewer than the pool's size). It
    # starts once the session's is done. The claims' refill is due at once here, so that it
    # falls during the session's start.
    monkeypatch.setattr("kernel_pool._warm.REFILL_AFTER_CLAIM_S", 0.0)
    pool = own_pool("refill-waits", max_kernels=6,
                    profiles={"default": _profile("default", min_idle=2)})
    await pool.start()
    await pool.wait_ready(timeout_s=120)
    seen: list[tuple[int, int]] = []

    async def watch() -> None:
        while True:
            seen.append((pool._starting["default"], pool._warming["default"]))
            await asyncio.sleep(0.002)

    watcher = asyncio.create_task(watch())
    try:
        sessions = await asyncio.gather(*(pool.create_session() for _ in range(3)))
    finally:
        watcher.cancel()
    # (kernels starting, of them warm ones): never a warm one while a session's is starting.
    assert any(starting for starting, _ in seen), "no session's start was seen"
    assert not [(starting, warming) for starting, warming in seen
                if warming and starting > warming], Counter(seen)
    await pool.wait_ready(timeout_s=60)  # then the refill came
    assert len(pool._idle["default"]) == 2
    for session in sessions:
        await pool.delete_session(session.id)
