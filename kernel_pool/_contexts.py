"""A session's code contexts: kernels of other languages (or more of the same) in its sandbox.

The session's own kernel is the default Python context (``"python"``). Any other context gets
its kernel lazily, at its first execution, started beside it in the same container
(:meth:`Sandbox.add_kernel`): same workspace, limits, network rules and lifetime, its own
variables. A request naming only a language uses that language's default context (its id is
the language: ``"r"``, ``"javascript"``, ``"bash"``); :meth:`Contexts.create` makes more.

Executions of every context go through the session's one queue, in order: a pause, resume or
restart of the session never meets one running. A memory pause keeps the contexts' kernels
the sandbox can hold (:meth:`Sandbox.context_refusal`) with the rest of it, and its restore
connects them again; a variables pause keeps none but the session's own. A context whose
kernel a pause ended is named in its ``not_kept`` and starts afresh at its next use.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import signal
from collections.abc import Iterator

from pydantic import BaseModel

from kernel_pool._channels import KernelDied, KernelState
from kernel_pool._context_code import start_code
from kernel_pool._execution import LateOutput
from kernel_pool._kernel import Kernel
from kernel_pool._languages import (
    DEFAULT_CONTEXT,
    KERNEL_LANGUAGES,
    check_language,
)
from kernel_pool.backends.base import Sandbox
from kernel_pool.exceptions import ContextNotFound, ContextStartFailed, InvalidRequest

logger = logging.getLogger(__name__)

MAX_CONTEXTS = 6
"""Contexts a session may hold beside its own kernel: each one's sockets take inodes of the
sandbox's small socket folder (and its memory the session's limit)."""
JS_LATE_OUTPUT = LateOutput(lambda marker: f"console.log({json.dumps(marker)})", wait_s=2.0,
                            quiet_s=0.2)
"""Deno's kernel says ``idle`` before its output task has sent everything (its console output
is published by a task of its own): its executions take the output until a marker printed
after them comes (within 2 s; else until 0.2 s of quiet)."""


class ContextInfo(BaseModel):
    """One code context of a session, as callers list it."""

    id: str
    language: str
    """The kernel's language: ``python``, ``r``, ``javascript`` (TypeScript too) or ``bash``."""
    execution_count: int = 0
    running: bool = False
    """Whether its kernel runs now (a context starts it at its first execution)."""
    cwd: str | None = None
    """The folder its kernel starts in, as it was asked for; None: the workspace."""


class ContextKernel(Kernel):
    """A context's kernel: interrupted as its language needs, no egress proxy of its own
    (the session's kernel serves the sandbox's), its environment given at its launch."""

    language = "python"
    hard_stop = "its kernel and every process it started were killed"

    def interrupt(self) -> None:
        if KERNEL_LANGUAGES[self.language].interrupt == "message":
            super().interrupt()
            return
        # R heeds SIGINT only, to its process group (system()'s child too).
        task = asyncio.ensure_future(self.sandbox.send_signal(signal.SIGINT))
        self._tasks.append(task)

    async def _ensure_egress(self) -> None:
        return None

    async def set_env(self, env: dict[str, str]) -> None:
        return None

    async def prepare(self, code: str) -> None:
        """Run ``code`` before any execution (silent, out of the history), or
        :class:`ContextStartFailed` with the kernel's own words."""
        msg_id, route = self.request("execute_request", {
            "code": code, "silent": True, "store_history": False, "user_expressions": {},
            "allow_stdin": False, "stop_on_error": False})
        try:
            async with asyncio.timeout(self._start_timeout_s):
                while True:
                    source, msg = await route.get()
                    if source == "died":
                        raise ContextStartFailed("its kernel died as it started")
                    if source == "shell" and isinstance(msg, dict):
                        break
        except TimeoutError:
            raise ContextStartFailed("its kernel did not answer its set-up") from None
        finally:
            self.forget(msg_id)
        content = msg.get("content")
        if isinstance(content, dict) and content.get("status") == "error":
            said = f"{content.get('ename') or ''}: {content.get('evalue') or ''}".strip(": ")
            raise ContextStartFailed(said[:500] or "its set-up failed")


class CodeContext:
    """A context: its language, its kernel once started, and why it lost its state."""

    def __init__(self, context_id: str, language: str, cwd: str | None = None) -> None:
        self.id = context_id
        self.language = language
        self.cwd = cwd
        """The folder its kernel starts in (None: the workspace)."""
        self.kernel: ContextKernel | None = None
        self.execution_count = 0
        self.lost: str | None = None
        """Why its kernel was restarted or ended since its last execution (the next one
        says so: ``restarted``)."""
        self.name = f"x{secrets.token_hex(4)}"
        """Its kernel's name in the sandbox's socket folder."""
        self.busy = False
        """An execution runs in it now (which learns of a death from its own run)."""

    @property
    def default(self) -> bool:
        return self.id == DEFAULT_CONTEXT

    def info(self, execution_count: int | None = None) -> ContextInfo:
        running = self.default or (self.kernel is not None
                                   and self.kernel.state is KernelState.READY)
        count = self.execution_count if execution_count is None else execution_count
        return ContextInfo(id=self.id, language=self.language, execution_count=count,
                           running=running, cwd=self.cwd)


class Contexts:
    """The code contexts of one session, by id, the default Python one first."""

    def __init__(self, session_id: str) -> None:
        self._session_id = session_id
        self._all: dict[str, CodeContext] = {
            DEFAULT_CONTEXT: CodeContext(DEFAULT_CONTEXT, "python")}

    def __iter__(self) -> Iterator[CodeContext]:
        return iter(list(self._all.values()))

    def get(self, context_id: str) -> CodeContext:
        context = self._all.get(context_id)
        if context is None:
            raise ContextNotFound(self._session_id, context_id)
        return context

    def resolve(self, language: str | None, context_id: str | None,
                offered: tuple[str, ...]) -> CodeContext:
        """The context an execution runs in: ``context_id``'s, else the default context of
        ``language`` (made now, its kernel started at its first execution)."""
        if context_id is not None:
            context = self.get(context_id)
            if language is not None and check_language(language, offered) != context.language:
                raise InvalidRequest(
                    f"context {context_id!r} runs {context.language}, not {language}; send "
                    "either the context_id or the language")
            return context
        kernel = check_language(language, offered)
        return self._all.get(kernel) or self._add(kernel, kernel)

    def adopt(self, context_id: str, language: str, name: str | None,
              cwd: str | None = None) -> CodeContext:
        """The context ``context_id`` a pause named (a memory image holding its kernel
        ``name``; made with the folder ``cwd``): the one known, else made again as it was (a
        gateway that took the paused session back, another node that resumes it)."""
        context = self._all.get(context_id)
        if context is None or context.language != language:
            context = self._all[context_id] = CodeContext(context_id, language, cwd)
        if name is not None:
            context.name = name
        return context

    def create(self, language: str | None, offered: tuple[str, ...],
               cwd: str | None = None) -> CodeContext:
        """A new context of ``language`` (its kernel starts at its first execution, in the
        folder ``cwd``: None, the workspace)."""
        kernel = check_language(language, offered)
        return self._add(f"ctx-{secrets.token_hex(6)}", kernel, cwd)

    def _add(self, context_id: str, language: str, cwd: str | None = None) -> CodeContext:
        if len(self._all) > MAX_CONTEXTS:
            raise InvalidRequest(
                f"session {self._session_id} already holds {MAX_CONTEXTS} code contexts beside "
                "its own kernel; remove one first")
        context = CodeContext(context_id, language, cwd)
        self._all[context_id] = context
        return context

    def pop(self, context_id: str) -> CodeContext:
        """Forget a context (the caller closes its kernel); the default one stays."""
        context = self.get(context_id)
        if context.default:
            raise InvalidRequest("the session's own Python context cannot be removed; delete "
                                 "the session instead")
        del self._all[context_id]
        return context

    @staticmethod
    async def start(context: CodeContext, sandbox: Sandbox, env: dict[str, str],
                    like: Kernel, start_timeout_s: float, *,
                    restored: bool = False) -> ContextKernel:
        """The context's kernel, ready: started now in ``sandbox`` (the session's) if it has
        none, started again if it died (``lost`` then says why); ``restored``: connected to
        the one the sandbox's restore from a memory image brought back."""
        kernel = context.kernel
        if kernel is not None and kernel.sandbox.info.container_id != sandbox.info.container_id:
            await close_context(context)  # of a sandbox the session left (a resume moved it)
            kernel = None
        if kernel is None:
            face = await sandbox.add_kernel(context.language, context.name, env,
                                            restored=restored)
            kernel = ContextKernel(face, like.profile, like.zmq_context, start_timeout_s)
            kernel.language = context.language
            kernel.on_death = lambda died: _died(context, died)
            context.kernel = kernel
            try:
                await kernel.start()
                if not restored:  # a restored kernel is as it was, set up already
                    await _set_up(context, kernel, env)
            except BaseException:
                await close_context(context)
                raise
        elif kernel.state is KernelState.DEAD:
            if context.lost is None:
                _died(context, kernel.death or KernelDied("its kernel died", oom=False))
            await kernel.restart()
            context.execution_count = 0
            try:
                await _set_up(context, kernel, env)
            except BaseException:
                await close_context(context)
                raise
        return kernel


async def _set_up(context: CodeContext, kernel: ContextKernel, env: dict[str, str]) -> None:
    """Run what the context's new kernel needs before its first execution (its folder, Java's
    properties); :class:`ContextStartFailed` saying why it could not."""
    code = start_code(context.language, context.cwd, env)
    if code is None:
        return
    try:
        await kernel.prepare(code)
    except ContextStartFailed as exc:
        where = f" in its folder {context.cwd!r}" if context.cwd is not None else ""
        raise ContextStartFailed(f"it could not be set up{where}: {exc}") from None


def _died(context: CodeContext, died: KernelDied) -> None:
    """A context's kernel died: its next execution starts it again and says so (one running
    now learns it from its own run)."""
    if not context.busy:
        context.lost = (f"{died.reason}, between executions; a fresh kernel was started "
                        "(variables lost, files kept)")


async def close_context(context: CodeContext, kill: bool = True, held: bool = False) -> None:
    """End the context's kernel, if it has one (its sockets removed, the container kept);
    ``kill=False`` when the container goes anyway; ``held`` when a memory image holds it
    (its count goes on when it is restored)."""
    kernel, context.kernel = context.kernel, None
    if not held:
        context.execution_count = 0
    if kernel is None:
        return
    kernel.on_death = None  # an end asked for, not a death to report
    try:
        if kill:
            await kernel.sandbox.kill()
        await kernel.close()
    except Exception as exc:  # its container may be gone already: nothing left to end
        logger.warning("context %s: ending its kernel failed: %s", context.id, exc)
