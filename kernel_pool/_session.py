"""A session: one kernel and its workspace, running executions one at a time, in order.

:class:`Session` is what callers above kernel_pool hold: every capability they use (execute,
interrupt, restart, relay raw Jupyter messages, workspace files, sandbox facts) is an async
method here, and the blocking I/O behind them runs in worker threads inside kernel_pool. New
lifecycle capabilities (pause, resume, fork, commands) join the kernel's section below.

The class is built in rooms (:mod:`kernel_pool._session_base` says how); this one holds the
execution queue's work (submit, run in order), raw Jupyter relays and closing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from kernel_pool._channels import KernelState
from kernel_pool._contexts import (
    JS_LATE_OUTPUT,
    CodeContext,
    close_context,
)
from kernel_pool._execution import ExecutionRun
from kernel_pool._handle import ExecutionHandle, Gate, utcnow
from kernel_pool._kernel import Kernel
from kernel_pool._languages import display_language, normalize_language
from kernel_pool._sandbox_fs import SessionSandboxFs
from kernel_pool._session_base import Lifecycle
from kernel_pool._session_contexts import SessionContexts
from kernel_pool._watch import end_watches
from kernel_pool.events import (
    DoneEvent,
    ErrorEvent,
    Execution,
    ExecutionStatus,
)
from kernel_pool.exceptions import (
    ContextNotFound,
    KernelPoolError,
    KernelUnavailable,
    QueueFull,
    SessionClosed,
)

logger = logging.getLogger(__name__)

class Session(SessionContexts, SessionSandboxFs):
    """One kernel with its workspace. Executions queue (bounded) and run one at a time."""

    lifecycle: Lifecycle[Session] | None

    def submit(self, code: str, timeout_s: float | None = None,
               execution_id: str | None = None, gate: Gate | None = None, *,
               language: str | None = None, context_id: str | None = None) -> ExecutionHandle:
        """Queue ``code``; returns at once with a handle to stream or await.

        ``gate``, if given, decides under the session's lock whether the code runs (see
        :data:`Gate`). ``context_id`` names the code context to run in; else ``language``
        (None: python) runs in that language's default context, made now if need be
        (:class:`UnknownLanguage` for one the image does not offer). Executions of every
        context share the session's one queue.
        """
        if self._closed:
            raise SessionClosed(self.id)
        timeout = self.profile.timeout_for(timeout_s)
        context = self._contexts.resolve(language, context_id, self.languages)
        if len(self._queue) >= self._settings.max_queued_executions:
            raise QueueFull(self.id, self._settings.max_queued_executions)
        # Recorded with its aliases resolved (``ts`` is ``typescript``, which runs in the
        # JavaScript context).
        sent_as = context.language if language is None else normalize_language(language)
        handle = ExecutionHandle(execution_id or uuid.uuid4().hex, code, timeout,
                                 language=sent_as, context_id=context.id)
        handle.gate = gate
        self._queue.add(handle, self._execute(handle), f"exec-{handle.id}")
        self._touch()
        return handle

    async def execute(self, code: str, timeout_s: float | None = None) -> Execution:
        """Run ``code`` and return the aggregate result."""
        return await self.submit(code, timeout_s).result()

    async def _execute(self, handle: ExecutionHandle) -> None:
        try:
            async with self._lock:
                handle.dequeued()
                if self._closed:
                    raise SessionClosed(self.id)
                if handle.withdrawn is not None:
                    self._publish(handle, DoneEvent(
                        status=ExecutionStatus.INTERRUPTED, execution_count=None,
                        duration_ms=0.0, reason=handle.withdrawn))
                    return
                if await self._queue.refused(handle):
                    return
                if self.paused and await self._resume_failed(handle):
                    return
                context = await self._context_ready(handle)
                if context is None:
                    return
                kernel = self.kernel if context.kernel is None else context.kernel
                lost = self._lost if context.default else context.lost
                run = ExecutionRun(kernel, handle.code, timeout_s=handle.timeout_s,
                                   caps=self.profile.caps, execution_id=handle.id,
                                   interrupt_grace_s=self._settings.interrupt_grace_s,
                                   restarted_before=lost,
                                   late_output=JS_LATE_OUTPUT
                                   if context.language == "javascript" else None)
                if context.default:
                    self._lost = None
                context.lost = None
                handle.run = run
                handle.started_at = utcnow()
                self._queue.started(handle)
                context.busy = True
                try:
                    done = await run.run(lambda event: self._publish(handle, event))
                finally:
                    context.busy = False
                count = (done.execution_count if done.execution_count is not None
                         else 0 if done.restarted else None)
                if count is not None:
                    if context.default:
                        self.execution_count = count
                    else:
                        context.execution_count = count
                self._publish(handle, done)
        except BaseException as exc:
            if handle.done is None:
                reason = ("the session was closed" if self._closed
                          else f"internal error: {exc!r}")
                if not isinstance(exc, asyncio.CancelledError | SessionClosed):
                    logger.exception("execution %s failed", handle.id)
                self._publish(handle, DoneEvent(status=ExecutionStatus.DIED, execution_count=None,
                                                duration_ms=0.0, reason=reason))
            if not isinstance(exc, Exception):
                raise
        finally:
            self._queue.remove(handle)
            self._touch()
            death = self.kernel.death
            if not self._closed and self.kernel.state == KernelState.DEAD and death is not None:
                self._kernel_died(death)  # died in the clean-up after the reply

    async def _context_ready(self, handle: ExecutionHandle) -> CodeContext | None:
        """The execution's context with its kernel ready (started now at its first use, or
        again after a death); None when it cannot be had (the execution then ends with an
        error that says why)."""
        try:
            context = self._contexts.get(handle.context_id)
            if not context.default:
                await self._contexts.start(context, self.kernel.sandbox,
                                           {**self.kernel.proxy_env(), **self.env}, self.kernel,
                                           self._settings.kernel_start_timeout_s)
            return context
        except KernelPoolError as exc:
            ename = type(exc).__name__
            reason = (str(exc) if isinstance(exc, ContextNotFound) else
                      f"the {display_language(handle.language)} kernel did not start: {exc}")
        self._publish(handle, ErrorEvent(ename=ename, evalue=reason,
                                         traceback=[f"{ename}: {reason}"]))
        self._publish(handle, DoneEvent(status=ExecutionStatus.ERROR, execution_count=None,
                                        duration_ms=0.0, reason=reason))
        return None

    async def relay(self, msg_type: str, content: dict[str, Any], *,
                    channel: str = "shell") -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Send one raw Jupyter request (``kernel_info_request``, ``complete_request``, ...)
        to the kernel beside the execution queue; yield ``(channel, message)`` for its reply
        and the iopub messages under it, parsed and signature-checked, until the kernel is
        idle again.

        Waits for a kernel that is (re)starting; :class:`KernelUnavailable` when it does not
        come back or dies before answering. Executions go through :meth:`submit`, never here.
        """
        kernel = await self._ready_kernel()
        async for item in kernel.relay(msg_type, content, channel,
                                       timeout_s=self.profile.max_timeout_s + 60):
            yield item
        if kernel.death is not None:
            raise KernelUnavailable(self.id, kernel.death.reason)

    async def _ready_kernel(self) -> Kernel:
        if self._closed:
            raise SessionClosed(self.id)
        if self.paused:  # a request that needs the kernel resumes the session
            await self.resume()
        try:
            async with asyncio.timeout(within := self.profile.start_timeout(
                    self._settings.kernel_start_timeout_s)):
                await self.kernel.settled.wait()
        except TimeoutError:
            raise KernelUnavailable(self.id, f"it did not come back within {within:g}s"
                                    ) from None
        if self._closed:
            raise SessionClosed(self.id)
        if self.kernel.state is not KernelState.READY:
            death = self.kernel.death
            raise KernelUnavailable(self.id, death.reason if death else self.kernel.state.value)
        return self.kernel

    async def close(self) -> None:
        """Stop everything and remove the sandbox (container and workspace)."""
        if self._closed:
            return
        self._closed = True
        await end_watches(self.watches, "the session was deleted")
        await self._queue.cancel()
        if self._dump is not None:  # a memory pause's, its packing cancelled above
            with contextlib.suppress(Exception):
                await self.kernel.sandbox.discard_checkpoint(self._dump)
            self._dump = None
        for context in self._contexts:
            await close_context(context, kill=False)  # the container goes with the kernel's
        await self.kernel.close()
