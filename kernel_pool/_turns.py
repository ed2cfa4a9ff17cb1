"""Turns to start kernels: a few at once, a session's own start before the warm pool's refill.

A refill after a burst asks for as many kernels as the burst took; queued in one line with the
starts of sessions that need a kernel now (the warm pool empty, or a paused session resuming),
those would wait behind the whole refill. Here a session's start takes the next free turn
before any refill that asked earlier; refills take turns in the order they asked.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator


class Turns:
    """At most ``size`` holders at once; urgent askers are served before the others."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._held = 0
        self._urgent: deque[asyncio.Future[None]] = deque()
        self._later: deque[asyncio.Future[None]] = deque()

    def __repr__(self) -> str:
        return (f"<Turns {self._held}/{self.size} held, {len(self._urgent)} urgent and "
                f"{len(self._later)} later waiting>")

    @contextlib.asynccontextmanager
    async def turn(self, urgent: bool) -> AsyncIterator[None]:
        """Hold a turn for the block; ``urgent``: a session's own start (else a refill's)."""
        await self._take(urgent)
        try:
            yield
        finally:
            self._give()

    async def _take(self, urgent: bool) -> None:
        if self._held < self.size and not self._urgent and (urgent or not self._later):
            self._held += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        (self._urgent if urgent else self._later).append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._give()  # handed a turn just as the asker was cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):
                    (self._urgent if urgent else self._later).remove(waiter)
            raise

    def _give(self) -> None:
        """A turn ends: hand it to the first urgent waiter, else the first other one."""
        for line in (self._urgent, self._later):
            while line:
                waiter = line.popleft()
                if not waiter.done():
                    waiter.set_result(None)  # the turn passes on: the count stays
                    return
        self._held -= 1
