"""The host memory the pool keeps available (``REPLGATE_MEMORY_RESERVE``): below it no kernel
starts until an idle session is paused, and the cull loop pauses idle sessions.

The shortage is real: the test's own process takes 3 GiB of the host's memory (written, so
the host counts it), against a reserve set 1.5 GiB under what the host had available just
before. Either side of the line there is 1.5 GiB, far more than a kernel (about 95 MiB) or the
other tests running beside these take or give back meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from kp_support import PoolFactory, eventually, run_ok

from kernel_pool import CapacityError, Profile
from kernel_pool._host_memory import machine_memory, memory_available
from kernel_pool.config import default_max_kernels, default_memory_reserve

GiB = 1024**3
HOG_BYTES = 3 * GiB
MARGIN_BYTES = HOG_BYTES // 2


def available() -> int:
    found = memory_available()
    assert found is not None, "this host's /proc/meminfo has no MemAvailable"
    return found


@contextmanager
def memory_taken(size: int) -> Iterator[None]:
    """``size`` bytes of this process's memory, written page by page while it lasts."""
    hog = b"\x01" * size
    try:
        yield
    finally:
        del hog


def one_profile() -> dict[str, Profile]:
    return {"default": Profile(name="default", workspace_size="64m", tmp_size="32m",
                               min_idle=0)}


def test_defaults_count_a_kernel_at_128_mib_and_keep_a_tenth_available() -> None:
    assert default_max_kernels(24 * GiB) == 153
    assert default_max_kernels(4 * GiB) == 25
    assert default_max_kernels(512 * 1024**2) == 3
    assert default_max_kernels(4096 * GiB) == 256
    assert default_memory_reserve(24 * GiB) == 24 * GiB // 10
    assert default_memory_reserve(2 * GiB) == 512 * 1024**2
    assert default_memory_reserve() == max(512 * 1024**2, machine_memory() // 10)


async def test_a_start_short_of_memory_pauses_an_idle_session_then_says_which_limit(
        own_pool: PoolFactory) -> None:
    # The cull loop is slow here (30 s): what pauses the first session is the second's start.
    reserve = available() - MARGIN_BYTES
    pool = own_pool("reserve", memory_reserve=str(reserve), capacity_wait_s=1.0,
                    profiles=one_profile())
    await pool.start()
    first = await pool.create_session()
    await run_ok(first, "kept = 'still here'")
    await asyncio.sleep(0.6)  # idle past the grace a just-made session gets

    assert pool.stats()["memory_short"] == 0
    with memory_taken(HOG_BYTES):
        assert pool.stats()["memory_short"] == 1  # what /healthz shows
        with pytest.raises(CapacityError) as caught:
            await pool.create_session()
        # Room was made as at max_kernels (the idle session paused), and it was not enough.
        assert first.paused
        assert caught.value.reserve == reserve
        message = str(caught.value)
        assert "REPLGATE_MEMORY_RESERVE" in message and f"{reserve // 2**20} MiB" in message
        assert "REPLGATE_MAX_KERNELS" not in message
        assert pool.stats()["idle"] == pool.stats()["starting"] == 0

    assert not pool._memory_short()
    second = await pool.create_session()
    assert await run_ok(second, "print(2 * 21)") == "42\n"
    assert await run_ok(first, "print(kept)") == "still here\n"


async def test_the_cull_loop_pauses_idle_sessions_while_memory_is_short(
        own_pool: PoolFactory) -> None:
    reserve = available() - MARGIN_BYTES
    pool = own_pool("reserve-cull", memory_reserve=str(reserve), cull_interval_s=0.2,
                    pause_after_s=0, profiles=one_profile())
    await pool.start()
    session = await pool.create_session()
    await run_ok(session, "kept = list(range(5))")
    await asyncio.sleep(1.0)
    assert not session.paused, "memory is not short: nothing is paused"

    with memory_taken(HOG_BYTES):
        await eventually(lambda: session.paused, 30)

    assert await run_ok(session, "print(sum(kept))") == "10\n"
