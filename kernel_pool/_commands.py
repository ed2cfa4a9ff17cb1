"""Shell commands in a session's sandbox, beside the kernel: ``sh -c CMD`` from start to end.

A command runs as the sandbox's user under the sandbox's limits (no network, the same memory,
CPU and process caps as the code), in the workspace. Its output is streamed as ``stdout`` and
``stderr`` events under the same caps as an execution's, the full text spilled to a workspace
file once they are hit. At ``timeout_s`` it is stopped with its whole process group (status
``timeout``, ``exit_code`` null); :meth:`CommandRun.kill` does the same on request (status
``killed``). A non-zero exit is data, not an error.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import time
from collections.abc import Callable

from kernel_pool._caps import SPILL_DIR, OutputLimiter, spill
from kernel_pool.backends.base import CommandProcess, Sandbox
from kernel_pool.config import OutputCaps
from kernel_pool.events import CommandDone, CommandResult, CommandStatus, StreamEvent

CommandEmit = Callable[[StreamEvent], None]
KILLED_ON_REQUEST = "killed on request with its process group"


class CommandRun:
    """Runs one command; :meth:`run` emits its output events and returns its ``done``."""

    def __init__(self, sandbox: Sandbox, command: str, *, command_id: str, timeout_s: float,
                 caps: OutputCaps, env: dict[str, str], cwd: str) -> None:
        self.sandbox = sandbox
        self.command = command
        self.id = command_id
        self.timeout_s = timeout_s
        self.env = env
        self.cwd = cwd
        self.limiter = OutputLimiter(caps, f"{SPILL_DIR}/{command_id}.txt")
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._process: CommandProcess | None = None
        self._kill_requested = asyncio.Event()
        self._kill_reason = KILLED_ON_REQUEST

    def kill(self, reason: str = KILLED_ON_REQUEST) -> bool:
        """Ask the command to stop (status ``killed``, ``reason`` in its result); False once
        a kill was asked for."""
        if self._kill_requested.is_set():
            return False
        self._kill_reason = reason
        self._kill_requested.set()
        return True

    async def run(self, emit: CommandEmit) -> CommandDone:
        started = time.monotonic()
        status = CommandStatus.OK
        reason: str | None = None
        process = self._process = await self.sandbox.start_command(
            self.command, env=self.env, cwd=self.cwd)
        utf8 = codecs.getincrementaldecoder("utf-8")
        decoders: dict[str, codecs.IncrementalDecoder] = {
            name: utf8("replace") for name in ("stdout", "stderr")}
        try:
            status, reason = await self._pump(process, decoders, emit, started)
            if status is not CommandStatus.OK:
                await process.kill()
                while await process.read() is not None:  # what it wrote until it stopped
                    pass
            exit_code = await process.wait() if status is CommandStatus.OK else None
        except BaseException:
            # cancelled (the gateway stops) or failed: the command must not run on unseen
            await asyncio.shield(process.kill())
            raise
        finally:
            with contextlib.suppress(Exception):
                await process.close()
        for name, decoder in decoders.items():
            self._emit(StreamEvent(type=name, text=decoder.decode(b"", final=True)), emit)
        await self._spill(final=True)
        for event in self.limiter.finish():
            self._collect(event)
            emit(event)
        return CommandDone(status=status, exit_code=exit_code, truncated=self.limiter.truncated,
                           duration_ms=round((time.monotonic() - started) * 1000, 3),
                           reason=reason)

    async def _pump(self, process: CommandProcess,
                    decoders: dict[str, codecs.IncrementalDecoder], emit: CommandEmit,
                    started: float) -> tuple[CommandStatus, str | None]:
        """Relay output until it ends, the deadline passes or a kill is asked for."""
        deadline = asyncio.get_running_loop().time() + self.timeout_s - (
            time.monotonic() - started)
        killed = asyncio.ensure_future(self._kill_requested.wait())
        try:
            while True:
                reading = asyncio.ensure_future(process.read())
                try:
                    async with asyncio.timeout_at(deadline):
                        await asyncio.wait({reading, killed},
                                           return_when=asyncio.FIRST_COMPLETED)
                except TimeoutError:
                    reading.cancel()
                    return CommandStatus.TIMEOUT, (f"command exceeded timeout_s="
                                                   f"{self.timeout_s:g}; it was killed with "
                                                   "its process group")
                if not reading.done():
                    reading.cancel()
                    return CommandStatus.KILLED, self._kill_reason
                item = reading.result()
                if item is None:
                    return CommandStatus.OK, None
                name, data = item
                self._emit(StreamEvent(type=name, text=decoders[name].decode(data)), emit)
                await self._spill()
        finally:
            killed.cancel()

    def _emit(self, event: StreamEvent, emit: CommandEmit) -> None:
        if not event.text:
            return
        for piece in self.limiter.stream(event.type, event.text):
            self._collect(piece)
            emit(piece)

    def _collect(self, event: StreamEvent) -> None:
        (self.stdout if event.type == "stdout" else self.stderr).append(event.text)

    async def _spill(self, final: bool = False) -> None:
        await spill(self.limiter, self.sandbox.workspace, final)

    def result(self, done: CommandDone) -> CommandResult:
        """The aggregate answer, once :meth:`run` returned ``done``."""
        return CommandResult(id=self.id, exit_code=done.exit_code, stdout="".join(self.stdout),
                             stderr="".join(self.stderr), truncated=done.truncated,
                             status=done.status, duration_ms=done.duration_ms,
                             reason=done.reason)
