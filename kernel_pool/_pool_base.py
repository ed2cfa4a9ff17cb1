"""What every part of the kernel pool stands on: its books (kernels idle, starting, in use;
sessions), starting one kernel, removing one, and its background tasks.

:class:`~kernel_pool.KernelPool` is this base and the rooms built on it, one concept each
(the warm kernels, running-kernel slots and the sessions holding them, forks and restores,
adoption), stacked in that order so each calls only what is below it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import uuid
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from kernel_pool._broker import SecretSource
from kernel_pool._kernel import Kernel
from kernel_pool._messages import make_context
from kernel_pool._session import Session
from kernel_pool._snapshot import SnapshotStore
from kernel_pool._turns import Turns
from kernel_pool.backends.base import (
    Sandbox,
    SandboxBackend,
    SandboxInfo,
    SandboxSpec,
    load_backend,
)
from kernel_pool.config import (
    KERNEL_SLOT_BYTES,
    PoolSettings,
    Profile,
    default_min_idle,
    parse_size,
)
from kernel_pool.exceptions import (
    CapacityError,
    KernelStartError,
    ProfileNotFound,
)
from kernel_pool.port import ClosedListener, SessionPort

logger = logging.getLogger(__name__)

START_TURNS = max(2, 2 * (os.cpu_count() or 1))
"""Kernels started at once, at most; the others wait their turn, in the order they were asked
for. A burst of a hundred creates started a hundred sandboxes together: on two cores each then
took as long as all of them (the engine's and CRIU's work shares the CPU), so the first
session was served when the last one was, seconds later; no more were made per second."""
START_ATTEMPTS = 2
"""A kernel that does not come up gets one more try in a fresh sandbox before the session's
request fails: a rare stuck start should not cost an agent its session."""


class PoolBase:
    """The pool's books and the calls every room uses (see the module's docstring)."""

    def __init__(self, settings: PoolSettings, backend: SandboxBackend | None = None, *,
                 address: str = "") -> None:
        self.settings = settings
        self.address = address
        """``HOST:PORT`` where this process is reached, as :meth:`nodes` shows it."""
        self.backend = backend or load_backend("docker", settings)
        self.secret_source: SecretSource | None = None
        """Sessions' secrets for the egress broker (the gateway's, when it has
        ``REPLGATE_SECRETS_KEY``; a node's asks its gateways); None: secret rules are
        refused."""
        self._context = make_context()
        self._idle: dict[str, deque[Kernel]] = {name: deque() for name in settings.profiles}
        self._starting: dict[str, int] = dict.fromkeys(settings.profiles, 0)
        self._warming: dict[str, int] = dict.fromkeys(settings.profiles, 0)
        """Of those starting, the ones the pool starts for itself (a refill), not for a caller."""
        self._waiters: dict[str, deque[asyncio.Future[Kernel | None]]] = {
            name: deque() for name in settings.profiles}
        """Resumes waiting for the next warm kernel a refill brings up (:meth:`take_warm`)."""
        self._in_use: set[Kernel] = set()
        self._kernels: weakref.WeakSet[Kernel] = weakref.WeakSet()
        """Every kernel made and not yet gone, wherever it is (for ``close``: no leaks)."""
        self._sessions: dict[str, Session] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._failures: dict[str, int] = dict.fromkeys(settings.profiles, 0)
        self._refill_at: dict[str, float] = dict.fromkeys(settings.profiles, 0.0)
        self._fill_handles: dict[str, asyncio.TimerHandle] = {}
        """Refills due shortly after a claim (:meth:`WarmPool._fill_soon`)."""
        self._closing = False
        self.on_session_closed: list[ClosedListener] = []
        """Called with (session, reason) when the pool culls or closes a session."""
        self.on_session_paused: list[Callable[[SessionPort], None]] = []
        """Called when the pool paused a session by itself (idle, or to make room)."""
        self.on_session_resumed: list[Callable[[SessionPort], None]] = []
        """Called when a paused session runs again (its sandbox may be a new one)."""
        self.keep_paused: Callable[[Session], Awaitable[None]] | None = None
        """Awaited after each pause, before it answers (a node writes the session's bundle to
        shared storage); it says in the session's ``reason`` what it could not keep."""
        self.keep_resumed: Callable[[Session], Awaitable[None]] | None = None
        """Awaited after each resume, before any code runs (a node records that the session
        runs past its last pause: lost with its node, it restarts from that pause)."""
        self.acquire_seconds: list[float] = []
        self.snapshots = SnapshotStore(settings.state_dir / "snapshots",
                                       parse_size(settings.snapshot_budget))
        """Paused sessions' snapshots (see :mod:`kernel_pool._snapshot`)."""
        self._held: set[str] = set()
        """Sessions not to be paused now: being paused already, or in a fork."""
        self._making: set[str] = set()
        """Sandboxes being made, not yet a kernel's (:meth:`remove_leftovers` spares them)."""
        self._unremoved: dict[str, SandboxInfo] = {}
        """Sandboxes whose removal failed, to be tried again (:meth:`_remove`)."""
        self._start_turns = Turns(START_TURNS)
        """Kernel starts under way (:data:`START_TURNS`), sessions' before refills'."""
        self.warm_size = warm_sizes(settings)
        self.memory_reserve = settings.memory_reserve_bytes()
        """Host memory kept available (``REPLGATE_MEMORY_RESERVE``): see :meth:`_no_room`."""
        """Warm kernels kept per profile: its ``min_idle``, or its share of the machine's."""

    def __repr__(self) -> str:
        idle = sum(len(q) for q in self._idle.values())
        starting = sum(self._starting.values())
        return (f"<KernelPool {idle} idle, {starting} starting, {len(self._in_use)} in use, "
                f"max {self.settings.max_kernels}>")

    def stats(self) -> dict[str, int]:
        return {"idle": sum(len(q) for q in self._idle.values()),
                "starting": sum(self._starting.values()),
                "in_use": len(self._in_use), "sessions": len(self._sessions),
                "paused": sum(s.paused for s in self._sessions.values()),
                "max": self.settings.max_kernels,
                # 1 while the host's memory is under the reserve (why nothing starts).
                "memory_short": int(self._memory_short())}

    def _total(self) -> int:
        return (sum(len(q) for q in self._idle.values()) + sum(self._starting.values())
                + len(self._in_use))

    def _no_room(self, profile: str) -> CapacityError | None:
        """No await (one read of ``/proc/meminfo`` at most): why one more kernel may not start
        now (``max_kernels`` of them counted, or the host's available memory under the
        reserve: :meth:`_memory_short`), None when it may."""
        if self._total() >= self.settings.max_kernels:
            return CapacityError(profile, self.settings.max_kernels)
        if self._memory_short():
            return CapacityError(profile, self.settings.max_kernels, self.memory_reserve)
        return None

    def _memory_short(self) -> bool:
        """Whether the host's available memory, less an idle kernel's
        (:data:`~kernel_pool.config.KERNEL_SLOT_BYTES`) for each start asked for and not done,
        is under :attr:`memory_reserve` (never, where the backend cannot tell). Starts waiting
        for their turn count too: a burst's are granted together, long before their memory is
        taken."""
        available = self.backend.memory_available()
        return (available is not None and available - KERNEL_SLOT_BYTES
                * sum(self._starting.values()) < self.memory_reserve)

    def _sessions_starting(self) -> int:
        """Kernel starts under way for sessions (a caller waits), not for the warm pool."""
        return sum(self._starting.values()) - sum(self._warming.values())

    @property
    def checkpoint_refusal(self) -> str | None:
        """Why the backend cannot checkpoint a sandbox, None when it can (Lifecycle)."""
        return None if self.backend.checkpoints else (
            self.backend.checkpoint_refusal or "this backend cannot checkpoint a sandbox")

    def profile(self, name: str) -> Profile:
        try:
            return self.settings.profiles[name]
        except KeyError:
            raise ProfileNotFound(name, sorted(self.settings.profiles)) from None

    async def languages(self, profile: str) -> tuple[str, ...]:
        """The languages sessions of ``profile`` offer, by its image (``typescript`` beside
        ``javascript``), before any session of it exists."""
        return await self.backend.image_languages(self.profile(profile).image)

    @contextlib.contextmanager
    def _being_made(self, spec: SandboxSpec) -> Iterator[None]:
        """While a sandbox is made, until its kernel object exists (no await in between)."""
        self._making.add(spec.sandbox_id)
        try:
            yield
        finally:
            self._making.discard(spec.sandbox_id)

    def _new_kernel(self, sandbox: Sandbox, profile: Profile) -> Kernel:
        """The kernel of ``sandbox`` (not started), counted among the pool's until it is gone."""
        kernel = Kernel(sandbox, profile, self._context, self.settings.kernel_start_timeout_s)
        kernel.egress_ca_file = self.settings.egress_ca_file
        kernel.secret_source = self.secret_source
        self._kernels.add(kernel)
        return kernel

    async def _start_kernel(self, profile: Profile, urgent: bool = True) -> Kernel:
        """Start one kernel (a second try in a fresh sandbox if the first does not come up);
        the caller has reserved a ``_starting`` slot for it. ``urgent``: a session waits for
        it (not a refill's), and takes the next turn to start (:mod:`kernel_pool._turns`)."""
        try:
            async with self._start_turns.turn(urgent):
                return await self._start_attempts(profile)
        except Exception:
            self._failures[profile.name] += 1
            raise
        finally:
            self._starting[profile.name] -= 1

    async def _start_attempts(self, profile: Profile) -> Kernel:
        attempt = 1
        while True:
            spec = SandboxSpec(sandbox_id=uuid.uuid4().hex[:12], profile=profile)
            with self._being_made(spec):
                kernel = self._new_kernel(await self.backend.create(spec), profile)
            try:
                await kernel.start()
            except KernelStartError as exc:
                await asyncio.shield(kernel.close())
                if attempt == START_ATTEMPTS or self._closing:
                    raise
                attempt += 1
                logger.warning("%s; trying again in a fresh sandbox", exc)
                continue
            except BaseException:
                await asyncio.shield(kernel.close())
                raise
            self._failures[profile.name] = 0
            return kernel

    def _wake(self, profile_name: str, kernel: Kernel | None, every: bool = False) -> bool:
        """Give ``kernel`` (None: nothing is coming) to the first resume still waiting in
        :meth:`take_warm`, or to every one; whether one took it."""
        waiters = self._waiters[profile_name]
        woke = False
        while waiters and (every or not woke):
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(kernel)
                woke = True
        return woke

    def _spawn(self, coro: Any, what: str) -> None:
        """Run ``coro`` in the background; should it fail, ``what`` it did is logged with
        why (once: its exception is retrieved here)."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._spawned, what))

    def _spawned(self, what: str, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.error("%s failed: %s", what, exc, exc_info=exc)

    async def _remove(self, kernel: Kernel) -> None:
        """Close a kernel and remove its sandbox. A removal that fails (the kernel logs why)
        is tried again by the cull loop, and by :meth:`close`."""
        try:
            await kernel.close()
        except Exception:
            info = kernel.sandbox.get_info()
            self._unremoved[info.sandbox_id] = info

    async def _remove_again(self) -> None:
        """Try again the removals that failed (:meth:`_remove`)."""
        for sandbox_id, info in list(self._unremoved.items()):
            try:
                await self.backend.remove(info)
            except Exception as exc:
                logger.warning("sandbox %s: removing it failed again: %s", sandbox_id, exc)
                continue
            self._unremoved.pop(sandbox_id, None)  # (a concurrent try may have done it)
            logger.info("sandbox %s removed on a later try", sandbox_id)


def warm_sizes(settings: PoolSettings) -> dict[str, int]:
    """Warm kernels per profile: each one's ``min_idle``; those that leave it unset share the
    machine's :func:`~kernel_pool.config.default_min_idle` evenly (one at least)."""
    unset = [name for name, p in settings.profiles.items() if p.min_idle is None]
    share = default_min_idle(settings.max_kernels) // max(1, len(unset))
    return {name: p.min_idle if p.min_idle is not None else max(1, share)
            for name, p in settings.profiles.items()}
