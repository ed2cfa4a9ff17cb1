"""Running-kernel slots (``max_kernels``) and the sessions holding them: a kernel acquired in an
I/O-free decision step, room made by pausing the least recently used idle session, the
:class:`~kernel_pool._session_base.Lifecycle` a session pauses and resumes through, and a
session's close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import anyio.to_thread

from kernel_pool._kernel import Kernel
from kernel_pool._session import Session
from kernel_pool._warm import WarmPool
from kernel_pool.config import Profile
from kernel_pool.exceptions import (
    BackendError,
    CapacityError,
    SessionNotFound,
)
from kernel_pool.state import SessionStatus

logger = logging.getLogger(__name__)

ROOM_POLL_S = 0.05
"""How often a kernel request waiting at ``max_kernels`` looks for room again."""
ROOM_GRACE_S = 0.5
"""How long a session must have been idle to be paused for a new session's kernel: one just
made (or just done with an execution) is about to be used, by a client whose next request
is on its way; paused, it would take a slot back at once to resume (in a burst of creates,
each would pause the one made before it)."""


class Slots(WarmPool):
    """Acquire kernels, make room, and keep the books of the sessions holding them."""

    def _take(self, profile: str) -> Kernel | None:
        """No await: an idle kernel, or None with a start slot reserved, or CapacityError."""
        kernel = self._pop_warm(profile)
        if kernel is not None:
            return kernel
        refusal = self._no_room(profile)
        if refusal is not None:
            raise refusal
        self._starting[profile] += 1
        return None

    async def acquire(self, profile_name: str = "default", *, refill: bool = True) -> Kernel:
        """A ready kernel of the profile: warm if one is idle, else started now.

        ``refill=False``: the caller refills the warm pool itself once it has all it needs
        (a fork), so the refill's kernel starts do not compete with its own for the CPU.
        """
        profile = self.profile(profile_name)
        if self._closing:
            raise BackendError("the kernel pool is shutting down")
        loop = asyncio.get_running_loop()
        started = loop.time()
        tried: set[str] = set()
        while True:
            try:
                kernel = self._take(profile.name)
                break
            except CapacityError:
                if self._warming[profile.name]:
                    # A warm kernel of this profile is on its way: wait for it rather than
                    # pause a session for a slot that is about to serve.
                    await asyncio.sleep(ROOM_POLL_S)
                    continue
                if await self._make_room(None, tried, ROOM_GRACE_S):
                    continue
                # Every slot is held by a session at work (or one just made, whose first
                # request is on its way: in a burst, the sessions made before this one):
                # wait for one to be idle and paused, or to end, rather than refuse at once.
                if loop.time() - started >= self.settings.capacity_wait_s:
                    raise
                await asyncio.sleep(ROOM_POLL_S)
        if kernel is None:
            task = asyncio.create_task(self._start_for_use(profile))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            try:
                kernel = await asyncio.shield(task)
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if task.cancelled() and not (current and current.cancelling()):
                    raise BackendError("the kernel pool shut down while starting a kernel"
                                       ) from None
                task.add_done_callback(self._adopt_abandoned)
                raise
        if refill:
            self._fill_soon(profile.name)
        self.acquire_seconds.append(loop.time() - started)
        del self.acquire_seconds[:-1000]
        return kernel

    async def _start_for_use(self, profile: Profile) -> Kernel:
        """A kernel started for a caller, counted in use as its start's slot is given up
        (no await in between): the caller wakes a loop turn later, and a slot counted
        neither starting nor in use meanwhile would let another request start one past
        ``max_kernels``. The last of the callers' starts under way refills the warm pools,
        which wait for them (:meth:`_fill`)."""
        try:
            kernel = await self._start_kernel(profile)
            self._in_use.add(kernel)
            return kernel
        finally:
            if self._sessions_starting() <= 0:
                for name in list(self.settings.profiles):
                    self._fill(name)

    def _adopt_abandoned(self, task: asyncio.Task[Kernel]) -> None:
        if not task.cancelled() and task.exception() is None:
            kernel = task.result()
            self._in_use.discard(kernel)
            if self._closing:
                self._spawn(self._remove(kernel), f"removing abandoned kernel {kernel.id}")
            else:
                self._park(kernel)

    async def reserve_slot(self, session: Session) -> None:
        """A running-kernel slot for a paused session about to resume (Lifecycle); with every
        slot held by a session at work, it waits for room as a new session's kernel does (up
        to ``capacity_wait_s``): in a burst, a session paused before its first execution (its
        client slower than :data:`ROOM_GRACE_S`) was refused that execution at once."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        tried: set[str] = set()
        while (refusal := self._no_room(session.profile.name)) is not None:
            if await self._make_room(session, tried):
                continue
            if loop.time() - started >= self.settings.capacity_wait_s:
                raise refusal
            await asyncio.sleep(ROOM_POLL_S)
        self._in_use.add(session.kernel)

    def release_slot(self, session: Session) -> None:
        """The session's kernel stopped (paused): its slot is free (Lifecycle)."""
        self._in_use.discard(session.kernel)

    async def take_warm(self, session: Session) -> Kernel | None:
        """A warm kernel for a paused session to resume onto (Lifecycle): an idle one, else
        the next one a refill under way brings up (rather than booting another beside it,
        which would slow both down), else None."""
        name = session.profile.name
        kernel = self._pop_warm(name)
        if kernel is not None:
            self._fill(name)
            return kernel
        if name in self._fill_handles:  # a claim's refill is due: it may serve this resume
            self._fill_handles.pop(name).cancel()
            self._fill(name)
        waiters = self._waiters[name]
        if self._warming[name] <= len(waiters) or self._closing:
            return None
        waiter: asyncio.Future[Kernel | None] = asyncio.get_running_loop().create_future()
        waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            with contextlib.suppress(ValueError):
                waiters.remove(waiter)
            handed = waiter.result() if waiter.done() and not waiter.cancelled() else None
            if handed is not None:  # handed over just as the resume was cancelled
                self.give_back(handed)
            raise

    def give_back(self, kernel: Kernel) -> None:
        """Remove a kernel a session no longer uses (Lifecycle)."""
        self._spawn(self.release(kernel), f"removing kernel {kernel.id}")

    async def paused_here(self, session: Session) -> None:
        if self.keep_paused is not None:
            await self.keep_paused(session)

    async def resumed_here(self, session: Session) -> None:
        if self.keep_resumed is not None:
            await self.keep_resumed(session)

    def resumed(self, session: Session) -> None:
        """Tell the listeners that a paused session runs again (Lifecycle)."""
        for callback in self.on_session_resumed:
            try:
                callback(session)
            except Exception:
                logger.exception("on_session_resumed callback failed")

    async def _make_room(self, exclude: Session | None, tried: set[str],
                         grace_s: float = 0.0) -> bool:
        """Free one slot: a warm kernel, else pause the least recently used session idle for
        at least ``grace_s``. False when nothing can go."""
        for queue in self._idle.values():
            if queue:
                kernel = queue.popleft()
                self._spawn(self._remove(kernel), f"removing idle kernel {kernel.id}")
                return True
        candidates = [s for s in self._sessions.values()
                      if s is not exclude and s.id not in tried and s.id not in self._held
                      and s.status is SessionStatus.IDLE and s.lifecycle is not None
                      and not s.commands  # a pause would stop its shell commands
                      and s.idle_for() >= grace_s]
        while candidates:
            victim = max(candidates, key=lambda s: s.idle_for())
            candidates.remove(victim)
            tried.add(victim.id)
            if await self._pause(victim, "to make room for another session"):
                return True
        return False

    async def _pause(self, session: Session, why: str) -> bool:
        self._held.add(session.id)
        try:
            await session.pause()
        except Exception as exc:
            logger.warning("session %s: pause %s failed: %s", session.id, why, exc)
            return False
        finally:
            self._held.discard(session.id)
        logger.info("session %s paused %s", session.id, why)
        for callback in self.on_session_paused:
            try:
                callback(session)
            except Exception:
                logger.exception("on_session_paused callback failed")
        return True

    def get_session(self, session_id: str) -> Session:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise SessionNotFound(session_id) from None

    @property
    def sessions(self) -> dict[str, Session]:
        return dict(self._sessions)

    async def delete_session(self, session_id: str, reason: str = "deleted") -> None:
        """Close the session and remove its container and workspace; ``reason`` is what the
        ``on_session_closed`` listeners hear (``"moved"``: it lives on elsewhere)."""
        await self._close_session(self.get_session(session_id), reason)

    async def _close_session(self, session: Session, reason: str) -> None:
        if self._sessions.pop(session.id, None) is None:
            return
        # Shielded: a cancelled caller (a client gone, the cull loop stopped) must not leave
        # the sandbox half-removed; the pool's books are settled when the removal ends.
        closing = asyncio.ensure_future(session.close())
        closing.add_done_callback(lambda _: self._session_closed(session, reason, closing))
        await asyncio.shield(closing)

    def _session_closed(self, session: Session, reason: str,
                        closing: asyncio.Future[None]) -> None:
        if not closing.cancelled() and closing.exception() is not None:
            # The kernel logged why; the cull loop tries the removal again.
            info = session.sandbox_info()
            self._unremoved[info.sandbox_id] = info
        self._in_use.discard(session.kernel)
        self._spawn(anyio.to_thread.run_sync(self.snapshots.delete, session.id),
                    f"deleting session {session.id}'s snapshot")
        self._fill(session.profile.name)
        for callback in self.on_session_closed:
            try:
                callback(session, reason)
            except Exception:
                logger.exception("on_session_closed callback failed")
