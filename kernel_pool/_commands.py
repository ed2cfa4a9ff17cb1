"""Shell commands in a session's sandbox, beside the kernel: ``sh -c CMD`` from start to end.

A command runs as the sandbox's user under the sandbox's limits (no network, the same memory,
CPU and process caps as the code), in the workspace. Its output is streamed as ``stdout`` and
``stderr`` events under the same caps as an execution's, the full text spilled to a workspace
file once they are hit. At ``timeout_s`` it is stopped with its whole process group (status
``timeout``, ``exit_code`` null); :meth:`CommandRun.kill` does the same on request (status
``killed``). A non-zero exit is data, not an error.

A command may take input: with ``stdin`` its standard input stays open for :meth:`CommandRun.write`
until :meth:`CommandRun.close_input`; with ``pty`` it runs on a terminal of that size (input
open, :meth:`CommandRun.resize`), whose output is one ``stdout`` stream. A terminal's output is
relayed as it comes, not capped (an interactive screen redraws itself for as long as it runs);
its aggregate keeps the last ``stream_chars`` characters. A command's output lines of up to
``COMMAND_LINE_CHARS`` pass whole (the stream cap still applies to the whole).
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
from kernel_pool.events import CommandDone, CommandResult, CommandStatus, PtySize, StreamEvent
from kernel_pool.exceptions import BackendError, CommandInputClosed

CommandEmit = Callable[[StreamEvent], None]
KILLED_ON_REQUEST = "killed on request with its process group"
COMMAND_LINE_CHARS = 64 * 1024
"""A command's output line passes whole up to this many characters (E2B's SDK reads lines of
64 KiB); an execution's lines keep the profile's cap."""


class CommandRun:
    """Runs one command; :meth:`run` emits its output events and returns its ``done``."""

    def __init__(self, sandbox: Sandbox, command: str, *, command_id: str, timeout_s: float,
                 caps: OutputCaps, env: dict[str, str], cwd: str, stdin: bool = False,
                 pty: PtySize | None = None) -> None:
        self.sandbox = sandbox
        self.command = command
        self.id = command_id
        self.timeout_s = timeout_s
        self.env = env
        self.cwd = cwd
        self.stdin = stdin or pty is not None
        self.pty = pty
        self.limiter = OutputLimiter(
            caps.model_copy(update={"line_chars": max(caps.line_chars, COMMAND_LINE_CHARS)}),
            f"{SPILL_DIR}/{command_id}.txt")
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._kept = 0
        """Characters of a terminal's aggregate kept in ``stdout``."""
        self._process: CommandProcess | None = None
        self._started: asyncio.Future[CommandProcess | None] = (
            asyncio.get_running_loop().create_future())
        """The process once it runs; None once it ended (or never started)."""
        self._input_open = self.stdin
        self._input = asyncio.Lock()
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

    async def _running(self) -> CommandProcess:
        """The process, once started, for its input; refused once it cannot take any."""
        if not self._input_open:
            raise CommandInputClosed(self.id, "its stdin was closed" if self.stdin else
                                     "it was started without stdin or a terminal")
        process = await asyncio.shield(self._started)
        if process is None:
            raise CommandInputClosed(self.id, "it ended")
        return process

    async def write(self, data: bytes) -> None:
        """Write to the command's stdin (or terminal), in order with other writes."""
        async with self._input:
            process = await self._running()
            try:
                await process.write(data)
            except BackendError:
                raise CommandInputClosed(self.id, "it ended or closed its input") from None

    async def close_input(self) -> None:
        """Close the command's stdin (after the writes before); no error when closed."""
        async with self._input:
            if self.stdin and not self._input_open:
                return
            process = await self._running()
            self._input_open = False
            await process.close_input()

    async def resize(self, size: PtySize) -> None:
        """Resize the command's terminal."""
        if self.pty is None:
            raise CommandInputClosed(self.id, "it was started without a terminal to resize")
        process = await self._running()
        try:
            await process.resize(size.cols, size.rows)
        except BackendError:
            if self._started.result() is not None:
                raise
            raise CommandInputClosed(self.id, "it ended") from None
        self.pty = size

    async def run(self, emit: CommandEmit) -> CommandDone:
        started = time.monotonic()
        status = CommandStatus.OK
        reason: str | None = None
        try:
            process = self._process = await self.sandbox.start_command(
                self.command, env=self.env, cwd=self.cwd, stdin=self.stdin,
                pty=(self.pty.cols, self.pty.rows) if self.pty is not None else None)
        except BaseException:
            self._started.set_result(None)
            raise
        self._started.set_result(process)
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
            self._started = asyncio.get_running_loop().create_future()
            self._started.set_result(None)
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
        if self.pty is not None:
            self._keep_screen(event.text)
            emit(event)
            return
        for piece in self.limiter.stream(event.type, event.text):
            self._collect(piece)
            emit(piece)

    def _keep_screen(self, text: str) -> None:
        """A terminal's aggregate: its last ``stream_chars`` characters."""
        self.stdout.append(text)
        self._kept += len(text)
        budget = self.limiter.caps.stream_chars
        while self._kept - len(self.stdout[0]) >= budget:
            self._kept -= len(self.stdout.pop(0))
            self.limiter.truncated = True

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
