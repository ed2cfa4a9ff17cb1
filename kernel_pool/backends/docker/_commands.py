"""Shell commands in a Docker sandbox: ``docker exec`` of the sandbox's command wrapper.

The output is read from the exec's hijacked socket on the event loop (Docker's stream framing:
an 8-byte header, stream and length, before each piece), so a flood is read only as fast as
the gateway takes it, and no thread is held per command. Stopping a command signals the
wrapper (``replgate_kernel/command.py``) from the host through a pidfd; the wrapper kills the
command's whole process group. The wrapper's host pid is kept in ``running`` while it runs, so
the clean-up after an execution spares a command started beside it.

A command may keep its stdin open: written to the same socket, closed by half-closing it (the
engine then closes the command's stdin). On a terminal (``tty``) the engine's stream is raw,
not framed, and is the terminal's output; the wrapper is told the size to start with
(``REPLGATE_PTY``), and resizes go through the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from kernel_pool._disk import SANDBOX_GID, SANDBOX_UID
from kernel_pool.backends.base import CommandProcess
from kernel_pool.exceptions import BackendError

WRAPPER = ("/opt/venv/bin/python", "-I", "-S", "/opt/replgate/replgate_kernel/command.py")
WATCHER = ("/opt/venv/bin/python", "-I", "-S", "/opt/replgate/replgate_kernel/watch.py")
"""The folder watcher (``SessionPort.watch_dir``), started like a command."""
FIND_PID_S = 10.0
"""How long the engine may take to start the exec and say its pid."""
KILL_GRACE_S = 2.0
"""How long the wrapper has to kill its group before it is killed itself."""
DRAIN_QUIET_S = 5.0
"""After the wrapper exited, how long the output may stay silent before it is taken as ended.
It normally ends at once (the wrapper kills its group, closing the last writer); this bounds only
a process that left the group and holds the output open. A short wait lost output here: on a
busy machine the engine relayed a quick command's lines over half a second after it exited."""
_HEADER = struct.Struct(">BxxxI")
_STREAMS = {1: "stdout", 2: "stderr"}

Run = Callable[..., Awaitable[Any]]
"""The backend's way to call the blocking Docker SDK off the loop."""
SignalInside = Callable[[int], Awaitable[bool]]
"""Sends a signal to the wrapper from inside the sandbox's runtime; whether it reached it."""


class DockerCommand(CommandProcess):
    """One ``docker exec`` of the command wrapper."""

    def __init__(self, api: Any, run: Run, exec_id: str, raw: Any, running: set[int],
                 tty: bool = False, signal_inside: SignalInside | None = None) -> None:
        self._api = api
        self._signal_inside = signal_inside
        """Where a signal to the exec's host process does not reach the wrapper (gVisor's
        terminals), the way that does."""
        self._tty = tty
        self._run = run
        self._exec_id = exec_id
        self._raw = raw
        """What the SDK gave: the socket, or a file object over it that must be closed too."""
        self._sock: socket.socket = raw._sock if hasattr(raw, "_sock") else raw
        self._sock.setblocking(False)
        self._buffer = bytearray()
        self._eof = False
        self._running = running
        self._pid = 0
        self._pidfd: int | None = None
        self._exited: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._killing: asyncio.Future[None] | None = None

    @classmethod
    async def start(cls, api: Any, run: Run, container_id: str, command: str, *,
                    env: dict[str, str], cwd: str, running: set[int], stdin: bool = False,
                    pty: tuple[int, int] | None = None,
                    argv: list[str] | None = None,
                    signal_inside: SignalInside | None = None) -> DockerCommand:
        """``sh -c command`` through the wrapper (or ``argv`` as it is, e.g. the watcher);
        ``signal_inside`` stops it when given."""
        tty = pty is not None
        if pty is not None:
            env = {"TERM": "xterm-256color", **env, "REPLGATE_PTY": f"{pty[0]}x{pty[1]}"}
        exec_id = (await run(api.exec_create, container_id,
                             [*WRAPPER, command] if argv is None else argv,
                             user=f"{SANDBOX_UID}:{SANDBOX_GID}", workdir=cwd,
                             environment=env, stdout=True, stderr=True,
                             stdin=stdin or tty, tty=tty))["Id"]
        raw = await run(api.exec_start, exec_id, socket=True, tty=tty)
        process = cls(api, run, exec_id, raw, running, tty, signal_inside)
        try:
            await process._find_pid()
            if pty is not None and process._pid:
                await process.resize(*pty)
        except BaseException:
            await process.close()
            raise
        return process

    async def _find_pid(self) -> None:
        # Until the engine has started the exec it says neither a pid nor an exit code (and
        # not Running): on a busy machine that lasts well past the first look.
        deadline = asyncio.get_running_loop().time() + FIND_PID_S
        while True:
            details = await self._run(self._api.exec_inspect, self._exec_id)
            if (details.get("Pid") or details.get("ExitCode") is not None
                    or asyncio.get_running_loop().time() > deadline):
                break
            await asyncio.sleep(0.01)
        pid = int(details.get("Pid") or 0)
        if pid and details.get("Running"):
            with contextlib.suppress(OSError):
                self._pidfd = os.pidfd_open(pid)
                self._pid = pid
                self._running.add(pid)
                asyncio.get_running_loop().add_reader(self._pidfd, self._wrapper_exited)

    def _wrapper_exited(self) -> None:
        if self._pidfd is not None:
            asyncio.get_running_loop().remove_reader(self._pidfd)
        if not self._exited.done():
            self._exited.set_result(None)

    async def read(self) -> tuple[str, bytes] | None:
        loop = asyncio.get_running_loop()
        while self._tty:  # a terminal's stream: raw output, no framing
            if self._eof:
                return None
            chunk = await self._receive(loop)
            if chunk:
                return "stdout", chunk
            self._eof = True
        while True:
            if len(self._buffer) >= _HEADER.size:
                kind, size = _HEADER.unpack_from(self._buffer)
                if len(self._buffer) >= _HEADER.size + size:
                    data = bytes(self._buffer[_HEADER.size : _HEADER.size + size])
                    del self._buffer[: _HEADER.size + size]
                    if kind in _STREAMS and data:
                        return _STREAMS[kind], data
                    continue
            if self._eof:
                return None
            chunk = await self._receive(loop)
            if not chunk:
                self._eof = True
                continue
            self._buffer += chunk

    async def _receive(self, loop: asyncio.AbstractEventLoop) -> bytes:
        """The next bytes of the socket; empty at its end, or once nothing more came for
        ``DRAIN_QUIET_S`` after the wrapper exited (a process that left the command's group
        may hold the output open, and the engine may still be relaying what came before)."""
        receiving = asyncio.ensure_future(loop.sock_recv(self._sock, 256 * 1024))
        try:
            watched: set[asyncio.Future[Any]] = {receiving, self._exited}
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            if not receiving.done():
                await asyncio.wait({receiving}, timeout=DRAIN_QUIET_S)
            if not receiving.done():
                return b""
            return receiving.result()
        except (OSError, ValueError):  # closed: ValueError for a socket closed by kill()
            return b""
        finally:
            receiving.cancel()

    async def write(self, data: bytes) -> None:
        # Raced against the process's end: once it ended, the engine may stop reading its
        # input without closing the socket, and a write bigger than the buffers would wait on
        # (a file program out of room waited minutes before its answer was read).
        sending = asyncio.ensure_future(
            asyncio.get_running_loop().sock_sendall(self._sock, data))
        try:
            await asyncio.wait({sending, self._exited}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            unsent = not sending.done()
            if unsent:
                sending.cancel()
        if unsent:
            raise BackendError("the command ended: it reads no more input")
        try:
            sending.result()
        except (OSError, ValueError) as exc:  # it ended, or its input was closed
            raise BackendError(f"the command's input is closed: {exc}") from exc

    async def close_input(self) -> None:
        # The engine reads the half-close as the end of the command's stdin.
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)

    async def resize(self, cols: int, rows: int) -> None:
        try:
            await self._run(self._api.exec_resize, self._exec_id, height=rows, width=cols)
        except Exception as exc:  # the SDK's APIError: ended meanwhile, or no terminal
            raise BackendError(f"the engine could not resize the terminal: {exc}") from exc

    async def kill(self) -> None:
        # One kill at a time, kept to its end even when its caller is cancelled: ``close``
        # puts off its release until the kill ends: the pidfd must stay open while it signals.
        if self._killing is None:
            self._killing = asyncio.ensure_future(self._kill())
        await asyncio.shield(self._killing)

    async def _kill(self) -> None:
        if self._exited.done():
            return
        if self._pidfd is None:
            # Its pid could not be had: stop reading it (shutdown, since a close leaves the
            # connection open while the SDK's file object over it lives); the clean-up after
            # the next execution kills it like any process left behind.
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            return
        if self._signal_inside is None or not await self._signal_inside(signal.SIGTERM):
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(self._exited), KILL_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    async def send_signal(self, signum: int) -> None:
        if self._pidfd is not None and not self._exited.done():
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, signum)

    async def wait(self) -> int | None:
        for _ in range(100):  # the engine's exec record may lag the process by a moment
            details = await self._run(self._api.exec_inspect, self._exec_id)
            if not details.get("Running"):
                code = details.get("ExitCode")
                return int(code) if code is not None else None
            await asyncio.sleep(0.02)
        return None

    async def close(self) -> None:
        if self._killing is not None and not self._killing.done():
            self._killing.add_done_callback(lambda _killed: self._release())
            return
        self._release()

    def _release(self) -> None:
        self._running.discard(self._pid)
        if self._pidfd is not None:
            if not self._exited.done():
                asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        self._raw.close()
        self._sock.close()
