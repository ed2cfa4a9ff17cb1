"""One running kernel in one sandbox: its start (launched, taken back, or restored from a memory
image), death watch, restart, pause and close. Its channels are :mod:`kernel_pool._channels`,
its network :mod:`kernel_pool._kernel_network`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from kernel_pool._caused import caused
from kernel_pool._channels import KernelDied, KernelState
from kernel_pool._kernel_network import KernelNetwork
from kernel_pool.backends.base import Sandbox
from kernel_pool.config import Profile
from kernel_pool.exceptions import KernelStartError

logger = logging.getLogger(__name__)

SLOW_START_S = 15.0
"""A kernel start slower than this is logged with the time of each step: a start that takes
a minute was seen twice in the test suite's gVisor leg on a loaded machine, cause unknown."""


class Kernel(KernelNetwork):
    """A kernel process in a sandbox, with its channels, routes and death watcher."""

    def __init__(self, sandbox: Sandbox, profile: Profile, context: zmq.asyncio.Context,
                 start_timeout_s: float) -> None:
        super().__init__(context)
        self.sandbox = sandbox
        self.profile = profile
        self.settled = asyncio.Event()
        """Set while the kernel is not starting or restarting (ready, dead or closed)."""
        self._state = KernelState.STARTING
        self.env: dict[str, str] = {}
        """Variables set in the kernel at hand-off and after every restart."""
        self._start_timeout_s = profile.start_timeout(start_timeout_s)
        self._oom_kills = 0
        self._expect_exit = False
        self._closing: asyncio.Future[None] | None = None
        self._removal: asyncio.Future[None] | None = None
        """The container removal a :meth:`stop` left running."""
        self._death: KernelDied | None = None
        self.on_death: Callable[[KernelDied], None] | None = None
        """Called when the kernel process dies unexpectedly (requests in flight learn it too)."""
        self._init_network()
        self._died = asyncio.Event()
        """Set with :attr:`death`, for waiters beside the death watcher."""

    hard_stop = "every process in the sandbox was killed"
    """What a hard stop of this kernel (:meth:`restart`) kills, as an execution says it."""

    @property
    def state(self) -> KernelState:
        return self._state

    @state.setter
    def state(self, state: KernelState) -> None:
        self._state = state
        if state in (KernelState.STARTING, KernelState.RESTARTING):
            self.settled.clear()
        else:
            self.settled.set()

    @property
    def death(self) -> KernelDied | None:
        """Why the kernel process died, if it has (until the next start)."""
        return self._death

    def __repr__(self) -> str:
        return f"<Kernel {self.id} {self.state.value} routes={len(self._routes)}>"

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, attach: bool = False, image: Path | None = None) -> None:
        """Launch the kernel process and wait until it answers ``kernel_info``.

        With ``attach``, connect to the kernel already running in the sandbox (one a previous
        gateway started) and launch a fresh one only if there is none. With ``image``, restore
        the sandbox from that checkpoint (:meth:`suspend`) instead, its kernel as it was. If
        it does not start, the kernel is DEAD (a request then learns it at once) until a start
        succeeds.
        """
        try:
            await self._start(attach, image)
        except BaseException as exc:
            if self.state is KernelState.STARTING:
                self.state = KernelState.DEAD
                self._death = KernelDied(f"the kernel did not start ({exc})", oom=False)
            raise

    async def _start(self, attach: bool, image: Path | None = None) -> None:
        steps: dict[str, float] = {}
        began = mark = time.monotonic()

        def step(name: str) -> None:
            nonlocal mark
            now = time.monotonic()
            steps[name], mark = now - mark, now

        try:
            await self._start_steps(attach, image, step)
        finally:
            if (took := time.monotonic() - began) > SLOW_START_S:
                logger.warning("kernel %s: its start took %.1f s (%s)", self.id, took,
                               ", ".join(f"{k} {v:.1f} s" for k, v in steps.items())
                               or "stopped before its first step ended")

    async def _start_steps(self, attach: bool, image: Path | None,
                           step: Callable[[str], None]) -> None:
        await self.settle()
        step("settling the previous kernel")
        await self.sandbox.reserve()  # a paused sandbox's workspace, given back at its pause
        step("reserving the workspace")
        self.state = KernelState.STARTING
        self._expect_exit = False
        self._death = None
        self._died.clear()
        self._channel_failed = None
        await self._ensure_egress()
        if image is not None:
            connection: dict[str, Any] | None = await self.sandbox.restore(image)
        else:
            connection = await self.sandbox.connection_info() if attach else None
        attached = connection is not None
        if connection is None:
            connection = await self.sandbox.launch_kernel()
        step("restoring" if image is not None else "launching")
        making_ca = self._ca_ahead()  # beside the kernel's boot
        usage = await self.sandbox.usage()
        self._oom_kills = usage.oom_kills or 0
        self._connect(connection)
        if attached and image is None:
            # Whatever it runs belonged to the gateway that died (recorded as interrupted):
            # stop it, and ask on the control channel, which a busy kernel still answers.
            self.interrupt()
        try:
            await self._wait_ready("control" if attached else "shell")
        except KernelStartError as exc:
            await self._disconnect()
            raise await self._with_start_errors(exc) from None
        except BaseException:
            await self._disconnect()
            raise
        finally:
            step("waiting for its first answer")
        await self.sandbox.started()
        self._tasks.append(asyncio.create_task(self._watch(), name=f"watch-{self.id}"))
        # The proxy's variables too: a kernel restored from a template started without them
        # (a booted one has them from its launcher already, and the session's env after).
        env = {**self.launcher_env(), **self.env, **self.trust_env()}
        if env:
            await self.set_env(env)
        if making_ca is not None:
            await making_ca
        self.state = KernelState.READY

    async def _with_start_errors(self, exc: KernelStartError) -> KernelStartError:
        """``exc`` with the last lines of the kernel's standard error, when it wrote any."""
        written = await self.sandbox.start_errors()
        if not written:
            return exc
        logger.warning("kernel %s did not start (%s); its standard error ends:\n%s",
                       self.id, exc.reason, written)
        return KernelStartError(exc.sandbox_id,
                                f"{exc.reason}; its standard error ends:\n{written}")

    async def _watch(self) -> None:
        code = await self.sandbox.wait()
        if self._expect_exit:
            return
        usage = await self.sandbox.usage()
        oom = (usage.oom_kills or 0) > self._oom_kills
        reason = ("the kernel ran out of memory and was killed (limit "
                  f"{self.profile.memory})" if oom else f"the kernel process exited (code {code})")
        self._die(reason, oom)

    def _die(self, reason: str, oom: bool) -> None:
        """The kernel is gone: say so to the executions waiting on it and to ``on_death``."""
        logger.info("kernel %s died: %s", self.id, reason)
        self._expect_exit = False
        self.state = KernelState.DEAD
        self._death = KernelDied(reason, oom)
        self._died.set()
        for route in list(self._routes.values()):
            with contextlib.suppress(asyncio.QueueFull):
                route.put_nowait(("died", self._death))
        if self.on_death is not None:
            try:
                self.on_death(self._death)
            except Exception:
                logger.exception("kernel %s: on_death callback failed", self.id)

    @caused("restart")
    async def restart(self) -> None:
        """Kill every process in the sandbox and start a fresh kernel (new key), same files."""
        self.state = KernelState.RESTARTING
        self._expect_exit = True
        await self._disconnect()
        await self.sandbox.kill(restart=True)
        await self.sandbox.cleanup(restart=True)
        await self.start()

    async def stop(self) -> None:
        """Stop every process of the sandbox (their memory is free when this returns) and
        remove its container in the background, keeping the workspace (for a pause).

        :meth:`start` waits for that removal, then makes a fresh container and kernel on the
        same workspace; :meth:`settle` waits for it alone.
        """
        self.state = KernelState.PAUSED
        self._expect_exit = True
        await self._disconnect()
        await self.sandbox.kill(restart=True)
        await self.sandbox.cleanup(restart=True)
        self._removal = asyncio.ensure_future(self._remove_and_release())
        self._removal.add_done_callback(self._removed)

    async def disconnect_for_checkpoint(self) -> None:
        """Drop the connections to a kernel that a checkpoint of its sandbox is to hold (a
        dump refuses a connected host socket): it runs on, unwatched, until the dump stops
        it; :meth:`close` then lets go of it, and the restored one is connected afresh."""
        self.state = KernelState.PAUSED
        self._expect_exit = True
        await self._disconnect()

    async def suspend(self) -> Path:
        """Checkpoint the whole sandbox (see :meth:`Sandbox.checkpoint`) and give back what it
        holds, like :meth:`stop`; the dump, for :meth:`Sandbox.pack_checkpoint`.

        The gateway's connections are dropped first (a dump refuses a connected host socket).
        If the checkpoint fails, they are made again and the kernel runs on as before.
        Cancelled, the checkpoint under way still runs to its end (runc's dump is never left
        running unowned) and what it made is discarded; the kernel, disconnected and perhaps
        dumped, is then the caller's to :meth:`stop`.
        """
        self._expect_exit = True
        checkpointing: asyncio.Future[Path] | None = None
        try:
            await self._disconnect()  # (cancelled half-way, it is reconnected below too)
            checkpointing = asyncio.ensure_future(self.sandbox.checkpoint())
            dump = await asyncio.shield(checkpointing)
        except BaseException as exc:
            if checkpointing is not None and not checkpointing.done():
                await asyncio.wait([checkpointing])
            if (checkpointing is None or checkpointing.cancelled()
                    or checkpointing.exception() is not None):
                await self._reconnect_after(exc)
                raise
            await asyncio.shield(self.sandbox.discard_checkpoint(checkpointing.result()))
            raise
        self.state = KernelState.PAUSED
        await self.sandbox.cleanup(restart=True)
        self._removal = asyncio.ensure_future(self.sandbox.release())
        self._removal.add_done_callback(self._removed)
        return dump

    async def _reconnect_after(self, failure: BaseException) -> None:
        """Reconnect after a checkpoint that failed with ``failure``. A reconnect that fails
        leaves the kernel dead and raises ``failure``, the news (its own error as context)."""
        try:
            await asyncio.shield(self._reconnect())
        except Exception as again:
            await asyncio.shield(self._disconnect())
            self._die(f"the kernel could not be reached after a checkpoint that failed "
                      f"({again})", False)
            raise failure  # noqa: B904 -- the checkpoint's own error, not the reconnect's

    async def _reconnect(self) -> None:
        """Connect again to the kernel that runs on after a checkpoint that failed."""
        connection = await self.sandbox.connection_info()
        if connection is None:
            self._die("the kernel ended during a checkpoint that failed", False)
            return
        self._expect_exit = False
        self._connect(connection)
        await self._wait_ready("control")
        self._tasks.append(asyncio.create_task(self._watch(), name=f"watch-{self.id}"))

    async def _remove_and_release(self) -> None:
        """Remove the stopped container, then give back what the sandbox holds (the
        workspace's unused blocks, its mounts): only once no container can use them."""
        await self.sandbox.kill(restart=False)
        await self.sandbox.release()

    def _removed(self, removal: asyncio.Future[None]) -> None:
        if not removal.cancelled() and removal.exception() is not None:
            logger.warning("kernel %s: removing its stopped container or giving back its "
                           "workspace's blocks failed (%s); the next start removes it",
                           self.id, removal.exception())

    async def settle(self) -> None:
        """Wait for the container removal :meth:`stop` left running, if any."""
        removal, self._removal = self._removal, None
        if removal is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(removal)

    async def detach(self) -> None:
        """Drop the gateway's connections and leave the kernel running, for a later gateway
        to take back (``start(attach=True)``)."""
        self.state = KernelState.DETACHED
        self._expect_exit = True
        await self._disconnect()
        if self.egress is not None:
            await self.egress.close()
        await self.sandbox.cleanup(restart=True)

    async def close(self) -> None:
        """Remove the sandbox: container, workspace and sockets.

        The removal runs to its end even when the caller is cancelled; every call waits for it.
        """
        if self._closing is None:
            self.state = KernelState.CLOSED
            self._expect_exit = True
            self._closing = asyncio.ensure_future(self._close())
            self._closing.add_done_callback(self._closed)
        await asyncio.shield(self._closing)

    def _closed(self, closing: asyncio.Future[None]) -> None:
        if not closing.cancelled() and closing.exception() is not None:
            logger.error("kernel %s: removing its sandbox %s failed: %s", self.id,
                         self.sandbox.info.sandbox_id, closing.exception())

    async def _close(self) -> None:
        await self.settle()
        await self._disconnect()
        if self.egress is not None:
            await self.egress.close()
        await self.sandbox.cleanup(restart=False)
