"""The warm pool: kernels started ahead of need, handed to sessions in a dictionary pop.

Like httpcore's connection pool, every decision (take an idle kernel, reserve a slot to start
one, refuse at capacity) is made in a synchronous, I/O-free step, so concurrent callers can
never over-commit; the I/O that follows (starting a container) runs in its own task, shielded
from a caller's cancellation, and a kernel nobody waits for any more joins the idle set.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, ClassVar

import anyio.to_thread

from kernel_pool._handle import utcnow
from kernel_pool._kernel import Kernel, KernelState, make_context
from kernel_pool._session import Session
from kernel_pool._snapshot import SnapshotStore, copy_workspace, load_variables
from kernel_pool._workspace import Workspace
from kernel_pool.backends.base import (
    Sandbox,
    SandboxBackend,
    SandboxInfo,
    SandboxSpec,
    load_backend,
)
from kernel_pool.config import PoolSettings, Profile, parse_size
from kernel_pool.exceptions import (
    BackendError,
    CapacityError,
    KernelStartError,
    NotDrainable,
    ProfileNotFound,
    SessionNotFound,
)
from kernel_pool.port import ClosedListener, SessionPort
from kernel_pool.state import NodeRecord, PauseInfo, SessionStatus

logger = logging.getLogger(__name__)

REFILL_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)
START_ATTEMPTS = 2
"""A kernel that does not come up gets one more try in a fresh sandbox before the session's
request fails: a rare stuck start should not cost an agent its session."""


class KernelPool:
    """Warm kernels per profile, capped in total, and the sessions that own kernels.

    It is the :class:`~kernel_pool.SessionHost` of one machine: its one node is this process,
    named by the settings' ``owner`` label.
    """

    first_epoch: ClassVar[int] = 0
    """Its sessions are never placed: their records start at epoch 0."""

    def __init__(self, settings: PoolSettings, backend: SandboxBackend | None = None, *,
                 address: str = "") -> None:
        self.settings = settings
        self.address = address
        """``HOST:PORT`` where this process is reached, as :meth:`nodes` shows it."""
        self.backend = backend or load_backend("docker", settings)
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

    def __repr__(self) -> str:
        idle = sum(len(q) for q in self._idle.values())
        starting = sum(self._starting.values())
        return (f"<KernelPool {idle} idle, {starting} starting, {len(self._in_use)} in use, "
                f"max {self.settings.max_kernels}>")

    # -- figures -----------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        return {"idle": sum(len(q) for q in self._idle.values()),
                "starting": sum(self._starting.values()),
                "in_use": len(self._in_use), "sessions": len(self._sessions),
                "paused": sum(s.paused for s in self._sessions.values()),
                "max": self.settings.max_kernels}

    def _total(self) -> int:
        return (sum(len(q) for q in self._idle.values()) + sum(self._starting.values())
                + len(self._in_use))

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

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, keep: Callable[[SandboxInfo], bool] | None = None) -> list[SandboxInfo]:
        """Remove sandboxes an earlier run left behind (those ``keep`` rejects), then fill.

        Returns the infos of the sandboxes kept, for the caller to re-adopt.
        """
        await self.backend.check(list(self.settings.profiles.values()))
        await anyio.to_thread.run_sync(self.snapshots.remove_partials)
        kept = []
        for info in await self.backend.list_sandboxes():
            if keep is not None and keep(info):
                kept.append(info)
                continue
            logger.info("removing orphaned sandbox %s", info.sandbox_id)
            await self.backend.remove(info)
        self._spawn(self._cull_loop(), "the cull loop")
        for name in self.settings.profiles:
            self._fill(name)
        return kept

    async def close(self) -> None:
        """Close every session and warm kernel: nothing is left running."""
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        for name in self._waiters:  # their refills were cancelled: nothing will come
            self._wake(name, None, every=True)
        for session in list(self._sessions.values()):
            if self.settings.keep_sessions_on_close:
                await self._keep_session(session)
            else:
                with contextlib.suppress(Exception):  # logged, and tried again below
                    await self._close_session(session, "gateway shut down")
        for queue in self._idle.values():
            while queue:
                await self._remove(queue.popleft())
        # Kernels a cancelled task was starting or closing: close() waits for (or does) that.
        for kernel in list(self._kernels):
            if kernel.state not in (KernelState.DETACHED, KernelState.PAUSED):  # kept
                await self._remove(kernel)
        await self._remove_again()  # what is still left, the next start's sweep removes
        await self.backend.close()
        self._context.term()

    async def _keep_session(self, session: Session) -> None:
        """Leave a session for the next gateway: running kernels go on running (it takes them
        back), paused ones stay in their snapshots."""
        self._sessions.pop(session.id, None)
        self._in_use.discard(session.kernel)
        if session.kernel.state is KernelState.READY:
            try:
                await session.kernel.detach()
                return
            except Exception as exc:
                logger.warning("session %s: could not leave it running (%s)", session.id, exc)
        if session.paused:
            await session.packed()  # a memory pause's archive, for the next gateway
            await session.kernel.settle()
        else:
            await session.close()

    async def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Wait until every profile has its ``min_idle`` warm kernels (for tests, benchmarks)."""
        async with asyncio.timeout(timeout_s):
            while not self._ready():  # noqa: ASYNC110 (no event for this; tests, benchmarks)
                await asyncio.sleep(0.05)

    def _ready(self) -> bool:
        return all(len(self._idle[name]) >= min(p.min_idle, self.settings.max_kernels)
                   for name, p in self.settings.profiles.items())

    # -- the decision step and the I/O -------------------------------------------------------

    def _pop_warm(self, profile: str) -> Kernel | None:
        """I/O-free: a ready idle kernel, now in use, or None; dead ones are removed."""
        idle = self._idle[profile]
        while idle:
            kernel = idle.popleft()
            if kernel.state is KernelState.READY:
                self._in_use.add(kernel)
                return kernel
            self._spawn(self._remove(kernel), f"removing dead idle kernel {kernel.id}")
        return None

    def _take(self, profile: str) -> Kernel | None:
        """I/O-free: an idle kernel, or None with a start slot reserved, or CapacityError."""
        kernel = self._pop_warm(profile)
        if kernel is not None:
            return kernel
        if self._total() >= self.settings.max_kernels:
            raise CapacityError(profile, self.settings.max_kernels)
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
                if self._starting[profile.name]:
                    # A warm kernel of this profile is on its way: wait for it rather than
                    # pause a session for a slot that is about to serve.
                    await asyncio.sleep(0.05)
                    continue
                if not await self._make_room(None, tried):
                    raise
        if kernel is None:
            task = asyncio.create_task(self._start_kernel(profile))
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
            self._in_use.add(kernel)
        if refill:
            self._fill(profile.name)
        self.acquire_seconds.append(loop.time() - started)
        del self.acquire_seconds[:-1000]
        return kernel

    def _adopt_abandoned(self, task: asyncio.Task[Kernel]) -> None:
        if not task.cancelled() and task.exception() is None:
            kernel = task.result()
            if self._closing:
                self._spawn(self._remove(kernel), f"removing abandoned kernel {kernel.id}")
            else:
                self._park(kernel)

    async def _start_kernel(self, profile: Profile) -> Kernel:
        """Start one kernel (a second try in a fresh sandbox if the first does not come up);
        the caller has reserved a ``_starting`` slot for it."""
        try:
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
        except Exception:
            self._failures[profile.name] += 1
            raise
        finally:
            self._starting[profile.name] -= 1

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
        self._kernels.add(kernel)
        return kernel

    def _fill(self, profile_name: str) -> None:
        """Start warm kernels in the background up to ``min_idle`` (within the cap)."""
        if self._closing:
            return
        profile = self.settings.profiles[profile_name]
        loop = asyncio.get_running_loop()
        if loop.time() < self._refill_at[profile_name]:
            return
        while (len(self._idle[profile_name]) + self._starting[profile_name] < profile.min_idle
               and self._total() < self.settings.max_kernels):
            self._starting[profile_name] += 1
            self._warming[profile_name] += 1
            self._spawn(self._warm(profile), f"a warm kernel start of profile {profile.name}")

    async def _warm(self, profile: Profile) -> None:
        try:
            kernel = await self._start_kernel(profile)
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
        if self._wake(kernel.profile.name, kernel):
            self._in_use.add(kernel)
            self._fill(kernel.profile.name)
            return
        self._idle[kernel.profile.name].append(kernel)
        kernel.on_death = lambda _died: self._idle_died(kernel)

    def _idle_died(self, kernel: Kernel) -> None:
        idle = self._idle[kernel.profile.name]
        if kernel in idle:
            logger.warning("idle kernel %s died; replacing it", kernel.id)
            idle.remove(kernel)
            self._spawn(self._remove(kernel), f"removing dead idle kernel {kernel.id}")
            self._fill(kernel.profile.name)

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

    async def release(self, kernel: Kernel) -> None:
        """A used kernel is never reused: remove its sandbox, then refill."""
        self._in_use.discard(kernel)
        try:
            await self._remove(kernel)
        finally:
            self._fill(kernel.profile.name)

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

    # -- running-kernel slots: pause to make room --------------------------------------------

    async def reserve_slot(self, session: Session) -> None:
        """A running-kernel slot for a paused session about to resume (Lifecycle)."""
        tried: set[str] = set()
        while self._total() >= self.settings.max_kernels:
            if not await self._make_room(session, tried):
                raise CapacityError(session.profile.name, self.settings.max_kernels)
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

    async def _make_room(self, exclude: Session | None, tried: set[str]) -> bool:
        """Free one slot: a warm kernel, else pause the least recently used idle session.
        False when nothing can go."""
        for queue in self._idle.values():
            if queue:
                kernel = queue.popleft()
                self._spawn(self._remove(kernel), f"removing idle kernel {kernel.id}")
                return True
        candidates = [s for s in self._sessions.values()
                      if s is not exclude and s.id not in tried and s.id not in self._held
                      and s.status is SessionStatus.IDLE and s.lifecycle is not None
                      and not s.commands]  # a pause would stop its shell commands
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

    # -- sessions ----------------------------------------------------------------------------

    async def create_session(self, profile: str = "default", *, env: dict[str, str] | None = None,
                             metadata: dict[str, Any] | None = None,
                             session_id: str | None = None, tenant: str = "",
                             admitted: Awaitable[None] | None = None,
                             lost: str | None = None) -> Session:
        """A session on a warm kernel (a hand-off: milliseconds when one is idle), of
        ``tenant``; ``admitted`` is awaited first (it raises what refuses one more session).

        ``lost``: why this session, known elsewhere before, starts again on a fresh kernel (its
        node was lost): its first execution says so (``restarted``, ``reason``).
        """
        if admitted is not None:
            await admitted
        session = await self._open_session(await self.acquire(profile), env=env,
                                           metadata=metadata, session_id=session_id,
                                           tenant=tenant)
        session._lost = lost
        return session

    async def _open_session(self, kernel: Kernel, *, env: dict[str, str] | None,
                            metadata: dict[str, Any] | None,
                            session_id: str | None = None, tenant: str = "") -> Session:
        """A session on an acquired kernel (released if this fails)."""
        try:
            if env:
                kernel.env = dict(env)
                await kernel.set_env(kernel.env)
        except BaseException:
            await self.release(kernel)
            raise
        session = Session(kernel, kernel.profile, self.settings, session_id=session_id, env=env,
                          metadata=metadata, tenant=tenant)
        session.lifecycle = self
        self._sessions[session.id] = session
        return session

    async def fork_session(self, parent_id: str, count: int = 1,
                           metadata: dict[str, Any] | None = None) -> list[Session]:
        """``count`` new sessions, each with the parent's variables (random generators
        reseeded) and a copy of its workspace; the parent goes on unchanged. All or none.

        Copies take the idle warm kernels. The others, where the backend can make a sandbox
        without starting it, are paused copies (the parent's snapshot and files, no process)
        that resume on first use like any paused session: a fork waits for no kernel boot
        and is not bounded by ``max_kernels``. Otherwise kernels are started for them.
        """
        parent = self.get_session(parent_id)
        # The parent's variables, stored once for every copy (streamed into each).
        key = f"{parent.id}-fork-{uuid.uuid4().hex[:12]}"
        try:
            info = await parent.snapshot(key)
            return await self._fork(parent, key, info, count, metadata)
        finally:
            await anyio.to_thread.run_sync(self.snapshots.delete, key)

    async def _fork(self, parent: Session, key: str, info: PauseInfo, count: int,
                    metadata: dict[str, Any] | None) -> list[Session]:
        profile = parent.profile
        children: list[Session] = []
        held = {parent.id}  # making room for a copy must not pause the parent or a copy
        self._held |= held

        async def one() -> None:
            # Decided in each copy's first step, before any await: the first copies take the
            # idle kernels, and the warm pool's refill waits for the fork (below) instead of
            # booting kernels beside the ones it starts.
            kernel = self._pop_warm(profile.name)
            if kernel is None and self.backend.stopped_sandboxes:
                await self._paused_copy(parent, key, info, metadata, children)
                return
            if kernel is None:
                kernel = await self.acquire(profile.name, refill=False)
            child = await self._open_session(kernel, env=parent.env, metadata=metadata,
                                             tenant=parent.tenant)
            children.append(child)
            held.add(child.id)
            self._held.add(child.id)
            await anyio.to_thread.run_sync(copy_workspace, parent.workspace, child.workspace)
            await load_variables(child.kernel, self.snapshots, key, reseed=True)

        try:
            # Every copy's outcome is awaited, so a failure leaves none half-made behind.
            outcomes = await asyncio.gather(*(one() for _ in range(count)),
                                            return_exceptions=True)
            failed = [o for o in outcomes if isinstance(o, BaseException)]
            if failed:
                for child in children:
                    await self._close_session(child, "its fork failed")
                raise failed[0]
        finally:
            self._held -= held
            self._fill(profile.name)
        return children

    async def _paused_copy(self, parent: Session, key: str, info: PauseInfo,
                           metadata: dict[str, Any] | None, children: list[Session]) -> None:
        """A paused copy of ``parent`` (appended to ``children`` as soon as it exists, for the
        fork to remove on failure): a sandbox made without starting it, the parent's files in
        its workspace and a copy of snapshot ``key`` under its id, to be loaded reseeded when
        it resumes."""
        spec = SandboxSpec(sandbox_id=uuid.uuid4().hex[:12], profile=parent.profile,
                           env=parent.env)
        with self._being_made(spec):
            sandbox = await self.backend.create_stopped(spec)
            child = self._stopped_session(sandbox, parent.profile, env=parent.env,
                                          metadata=metadata, tenant=parent.tenant)
        children.append(child)
        await anyio.to_thread.run_sync(copy_workspace, parent.workspace, sandbox.workspace)
        child.pause_info = await anyio.to_thread.run_sync(
            self.snapshots.copy, key, child.id, info.model_copy(update={"reseed": True}))
        await sandbox.release()  # lean from the start: its image holds its files alone

    def _stopped_session(self, sandbox: Sandbox, profile: Profile, *,
                         env: dict[str, str] | None, metadata: dict[str, Any] | None,
                         session_id: str | None = None, tenant: str = "") -> Session:
        """A paused session on a sandbox where nothing runs; it resumes when first needed."""
        kernel = self._new_kernel(sandbox, profile)
        kernel.env = dict(env or {})
        kernel.state = KernelState.PAUSED
        session = Session(kernel, profile, self.settings, session_id=session_id, env=env,
                          metadata=metadata, tenant=tenant)
        session.lifecycle = self
        self._sessions[session.id] = session
        return session

    async def restore_session(self, fill: Callable[[Workspace], Awaitable[PauseInfo]], *,
                              session_id: str, profile: str = "default",
                              env: dict[str, str] | None = None,
                              metadata: dict[str, Any] | None = None,
                              created_at: str | None = None, execution_count: int = 0,
                              lost: str | None = None, tenant: str = "") -> Session:
        """A paused session made from what another pool kept of it (a node's bundle): a
        sandbox made without starting it, ``fill`` puts the files in its workspace and the
        variables snapshot in :attr:`snapshots` under ``session_id`` (what it keeps returned);
        the session resumes when first needed. ``lost``: see :meth:`create_session`. On any
        failure nothing of it is left."""
        chosen = self.profile(profile)
        if not self.backend.stopped_sandboxes:
            raise BackendError(f"the {self.backend.name} backend cannot make a sandbox without "
                               "starting it, which a restored session needs")
        spec = SandboxSpec(sandbox_id=uuid.uuid4().hex[:12], profile=chosen, env=env or {})
        with self._being_made(spec):
            sandbox = await self.backend.create_stopped(spec)
            kernel = self._new_kernel(sandbox, chosen)
        try:
            info = await fill(sandbox.workspace)
            await sandbox.release()  # lean from the start: its image holds its files alone
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(kernel.close())
            await anyio.to_thread.run_sync(self.snapshots.delete, session_id)
            raise
        kernel.env = dict(env or {})
        kernel.state = KernelState.PAUSED
        session = Session(kernel, chosen, self.settings, session_id=session_id, env=env,
                          metadata=metadata, tenant=tenant)
        session.lifecycle = self
        session.pause_info = info
        session.recall_contexts()
        session._lost = lost
        if created_at:
            session.created_at = created_at
        session.execution_count = execution_count
        self._sessions[session.id] = session
        return session

    async def adopt_paused_session(self, info: SandboxInfo, *, session_id: str,
                                   env: dict[str, str] | None = None,
                                   metadata: dict[str, Any] | None = None,
                                   created_at: str | None = None,
                                   execution_count: int = 0, tenant: str = "") -> Session:
        """Take back a session an earlier gateway paused: it stays paused (no kernel runs)
        until something needs it, and resumes from its snapshot then."""
        profile = self.profile(info.profile)
        if self.snapshots.info(session_id) is None:
            raise BackendError(f"session {session_id} has no snapshot to resume from")
        sandbox = await self.backend.load_stopped(info, profile, env or {})
        session = self._stopped_session(sandbox, profile, env=env, metadata=metadata,
                                        session_id=session_id, tenant=tenant)
        session.pause_info = self.snapshots.info(session_id)
        await session.take_back()
        if created_at:
            session.created_at = created_at
        session.execution_count = execution_count
        return session

    async def adopt_session(self, info: SandboxInfo, *, session_id: str,
                            env: dict[str, str] | None = None,
                            metadata: dict[str, Any] | None = None,
                            created_at: str | None = None, execution_count: int = 0,
                            tenant: str = "") -> Session:
        """Take back a session whose sandbox a previous gateway left running (see ``start``).

        Its kernel keeps its variables when it is still running; otherwise a fresh kernel starts
        on the same workspace.
        """
        profile = self.profile(info.profile)
        if self._total() >= self.settings.max_kernels:
            raise CapacityError(profile.name, self.settings.max_kernels)
        sandbox = await self.backend.load(info, profile)
        kernel = self._new_kernel(sandbox, profile)
        kernel.env = dict(env or {})
        self._in_use.add(kernel)
        try:
            await kernel.start(attach=True)
        except BaseException:
            self._in_use.discard(kernel)
            await asyncio.shield(kernel.close())
            raise
        session = Session(kernel, profile, self.settings, session_id=session_id, env=env,
                          metadata=metadata, tenant=tenant)
        session.lifecycle = self
        if created_at:
            session.created_at = created_at
        session.execution_count = execution_count
        self._sessions[session.id] = session
        return session

    async def remove_sandbox(self, info: SandboxInfo) -> None:
        """Remove a sandbox ``start`` kept that will not be taken back: container, workspace."""
        await self.backend.remove(info)

    async def remove_leftovers(self) -> None:
        """Remove every sandbox on the host that no kernel or session of this pool uses: what
        a gateway killed while making one left (folders, mounts, but no container for
        :meth:`start` to find). Call it once the sessions to keep are taken back."""
        found = await self.backend.list_on_host()
        used = self._making | {kernel.sandbox.info.sandbox_id for kernel in self._kernels}
        for info in found:
            if info.sandbox_id not in used:
                logger.info("removing what sandbox %s left on the host", info.sandbox_id)
                self._unremoved[info.sandbox_id] = info
        await self._remove_again()

    async def image_digest(self, image: str) -> str | None:
        """The content id of ``image`` as the backend has it (for the audit log), if known."""
        return await self.backend.image_digest(image)

    def get_session(self, session_id: str) -> Session:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise SessionNotFound(session_id) from None

    @property
    def sessions(self) -> dict[str, Session]:
        return dict(self._sessions)

    async def find(self, session_id: str, *, tenant: str | None = None) -> Session:
        """The session, if ``tenant``'s (when named); SessionNotFound otherwise."""
        session = self._sessions.get(session_id)
        if session is None or (tenant is not None and session.tenant != tenant):
            raise SessionNotFound(session_id)
        return session

    async def tenant_of(self, session_id: str) -> str | None:
        session = self._sessions.get(session_id)
        return session.tenant if session is not None else None

    async def list_sessions(self, tenant: str | None = None) -> list[Session]:
        return [session for session in self._sessions.values()
                if tenant is None or session.tenant == tenant]

    async def count_sessions(self, tenant: str | None = None) -> int:
        return len(await self.list_sessions(tenant))

    async def nodes(self) -> list[NodeRecord]:
        """This process, the one node of one machine, as a node's heartbeat would show it."""
        stats = self.stats()
        return [NodeRecord(id=self.settings.owner, address=self.address, state="up",
                           kernels=stats["idle"] + stats["in_use"],
                           max_kernels=self.settings.max_kernels, sessions=stats["sessions"],
                           heartbeat_at=utcnow())]

    async def drain(self, node_id: str, draining: bool) -> NodeRecord:
        """Refused: :class:`~kernel_pool.NotDrainable` (one machine has nowhere to drain to)."""
        raise NotDrainable

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

    async def _cull_loop(self) -> None:
        interval = self.settings.cull_interval_s
        if self.settings.pause_after_s:
            interval = min(interval, max(self.settings.pause_after_s / 2, 0.5))
        while True:
            await asyncio.sleep(interval)
            await self._remove_again()
            for session in list(self._sessions.values()):
                if session.idle_for() > self.settings.idle_ttl_s:
                    reason = f"idle for more than {self.settings.idle_ttl_s:g}s"
                elif session.age() > self.settings.max_lifetime_s:
                    reason = f"older than the maximum lifetime of {self.settings.max_lifetime_s:g}s"
                else:
                    pause_after = self.settings.pause_after_s
                    if (pause_after and session.idle_for() > pause_after
                            and session.status is SessionStatus.IDLE
                            and session.id not in self._held and not session.pause_failed):
                        self._spawn(self._pause(session, f"after {pause_after:g}s idle"),
                                    f"pausing idle session {session.id}")
                    continue
                logger.info("culling session %s: %s", session.id, reason)
                with contextlib.suppress(Exception):  # logged, and tried again (above)
                    await self._close_session(session, reason)
