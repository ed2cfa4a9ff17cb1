"""The warm kernels: started ahead of need up to each profile's ``min_idle`` (unset: its share of
the machine's, :func:`~kernel_pool.config.default_min_idle`), kept idle and frozen (no CPU while
they wait), thawed and handed out in one I/O-free step, replaced when they die or are used.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import ClassVar

from kernel_pool._channels import KernelState
from kernel_pool._kernel import Kernel
from kernel_pool._pool_base import PoolBase, warm_sizes
from kernel_pool.config import Profile

logger = logging.getLogger(__name__)

REFILL_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)
REFILL_AFTER_CLAIM_S = 0.5
"""A claimed warm kernel's replacement starts this long after the claim: a burst's claims
arrive together, and restores started among them (a fraction of a second of CPU each) would
slow the first executions of the sessions just made. A claim meanwhile joins the same refill."""


class WarmPool(PoolBase):
    """Fill, park, hand out and release warm kernels."""

    adds_profiles: ClassVar[bool] = True

    def set_profile(self, profile: Profile) -> None:
        """Add a profile while the pool runs, or replace the one of its name: its idle kernels
        of another image are removed, and it fills to its ``min_idle`` (a custom template's
        profile, sized by its use)."""
        name = profile.name
        old = self.settings.profiles.get(name)
        self.settings.profiles[name] = profile
        self.warm_size = warm_sizes(self.settings)  # (the machine's share may change too)
        for books in (self._starting, self._warming, self._failures):
            books.setdefault(name, 0)
        self._refill_at.setdefault(name, 0.0)
        self._idle.setdefault(name, deque())
        self._waiters.setdefault(name, deque())
        if old is not None and (old.image != profile.image or profile.min_idle == 0):
            self._drop_idle(name)
        self._fill(name)

    def remove_profile(self, name: str) -> None:
        """Forget a profile :meth:`set_profile` added; its sessions run on to their end."""
        if self.settings.profiles.pop(name, None) is not None:
            self.warm_size = warm_sizes(self.settings)
            self._drop_idle(name)

    def _drop_idle(self, name: str) -> None:
        idle = self._idle.get(name, deque())
        while idle:
            kernel = idle.popleft()
            self._spawn(self._remove(kernel), f"removing idle kernel {kernel.id} of {name}")

    def _pop_warm(self, profile: str) -> Kernel | None:
        """I/O-free: a ready idle kernel, now in use, or None; dead ones are removed."""
        idle = self._idle[profile]
        while idle:
            kernel = idle.popleft()
            kernel.sandbox.thaw_warm()
            if kernel.state is KernelState.READY:
                self._in_use.add(kernel)
                return kernel
            self._spawn(self._remove(kernel), f"removing dead idle kernel {kernel.id}")
        return None

    def _fill_soon(self, profile_name: str) -> None:
        """:meth:`_fill` in :data:`REFILL_AFTER_CLAIM_S`, once for the claims until then."""
        if profile_name in self._fill_handles or self._closing:
            return
        loop = asyncio.get_running_loop()
        self._fill_handles[profile_name] = loop.call_later(
            REFILL_AFTER_CLAIM_S, self._fill_now, profile_name)

    def _fill_now(self, profile_name: str) -> None:
        self._fill_handles.pop(profile_name, None)
        self._fill(profile_name)

    def _fill(self, profile_name: str) -> None:
        """Start warm kernels in the background up to ``min_idle`` (within the cap)."""
        if self._closing:
            return
        profile = self.settings.profiles.get(profile_name)
        if profile is None:  # removed while it ran (a deleted template's)
            return
        loop = asyncio.get_running_loop()
        if loop.time() < self._refill_at[profile_name]:
            return
        if self._sessions_starting() > 0:
            # Sessions wait for kernels of their own (a burst past the warm pool): a refill's
            # start now takes the CPU theirs need. The last of theirs to end fills again.
            return
        while (len(self._idle[profile_name]) + self._starting[profile_name]
               < self.warm_size[profile_name] and self._no_room(profile_name) is None):
            self._starting[profile_name] += 1
            self._warming[profile_name] += 1
            self._spawn(self._warm(profile), f"a warm kernel start of profile {profile.name}")

    async def _warm(self, profile: Profile) -> None:
        try:
            kernel = await self._start_kernel(profile, urgent=False)
        except Exception as exc:
            self._wake(profile.name, None)  # a resume waiting for it starts its own
            failures = self._failures[profile.name]
            delay = REFILL_BACKOFF_S[min(failures, len(REFILL_BACKOFF_S)) - 1]
            logger.error("warm kernel for profile %s failed to start (%s); retry in %ss",
                         profile.name, exc, delay)
            loop = asyncio.get_running_loop()
            self._refill_at[profile.name] = loop.time() + delay
            loop.call_later(delay, self._fill, profile.name)
            return
        finally:
            self._warming[profile.name] -= 1
        if self._closing:
            await kernel.close()
            return
        self._park(kernel)

    def _park(self, kernel: Kernel) -> None:
        """Hand a started kernel to a resume waiting for one, else make it idle; should it
        die there, it is replaced at once."""
        current = self.settings.profiles.get(kernel.profile.name)
        if current is None or current.image != kernel.profile.image:  # removed or rebuilt
            self._in_use.add(kernel)
            self._spawn(self.release(kernel), f"removing kernel {kernel.id} of an old profile")
            return
        if self._wake(kernel.profile.name, kernel):
            self._in_use.add(kernel)
            self._fill(kernel.profile.name)
            return
        self._idle[kernel.profile.name].append(kernel)
        kernel.on_death = lambda _died: self._idle_died(kernel)
        kernel.sandbox.freeze_warm()  # no CPU while it waits; thawed when it is taken

    def _idle_died(self, kernel: Kernel) -> None:
        idle = self._idle[kernel.profile.name]
        if kernel in idle:
            logger.warning("idle kernel %s died; replacing it", kernel.id)
            idle.remove(kernel)
            self._spawn(self._remove(kernel), f"removing dead idle kernel {kernel.id}")
            self._fill(kernel.profile.name)

    async def release(self, kernel: Kernel) -> None:
        """A used kernel is never reused: remove its sandbox, then refill."""
        self._in_use.discard(kernel)
        try:
            await self._remove(kernel)
        finally:
            self._fill(kernel.profile.name)

    async def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Wait until every profile has its warm kernels (for tests, benchmarks)."""
        async with asyncio.timeout(timeout_s):
            while not self._ready():  # noqa: ASYNC110 (no event for this; tests, benchmarks)
                await asyncio.sleep(0.05)

    def _ready(self) -> bool:
        return all(len(self._idle[name]) >= min(size, self.settings.max_kernels)
                   for name, size in self.warm_size.items())
