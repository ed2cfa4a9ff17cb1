"""gVisor's control socket: the sandbox's own process table and signals, asked from the host
without starting a process.

Every ``runsc`` command that reaches into a running sandbox (``ps``, ``kill``, ``events``)
talks to its sentry over one Unix socket, ``<runsc root>/runsc-<sandbox id>.sock``, with a
small protocol of gVisor's (urpc): the client writes one JSON object ``{"method", "arg"}`` and
reads one back, ``{"success", "err", "result"}``, on a stream that stays open for the next
call. Spoken directly it answers in a fraction of a millisecond, where starting ``runsc ps``
costs 20-50 ms: this is what lets every execution under gVisor check for processes it left
behind at no visible cost. Only the methods ``runsc`` itself uses are called, with its
argument shapes (the root container's id is the sandbox's id under Docker).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import Any

CALL_TIMEOUT_S = 5.0
"""A sentry that does not answer this fast is stuck or swamped: the caller falls back."""
MAX_ANSWER_BYTES = 4 << 20
"""Bounds what is read from a sandbox's answer (its process table, a few hundred bytes a
process, with at most the profile's ``pids`` processes)."""


class ControlError(Exception):
    """The control socket could not be reached, or it refused or garbled the call."""


class SandboxControl:
    """The control socket of one gVisor sandbox (async; one connection per call, so calls
    from concurrent tasks never interleave on a stream)."""

    def __init__(self, root: str, sandbox_id: str) -> None:
        self.root = root
        self.sandbox_id = sandbox_id

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        # The socket's path (runsc's root, a 64-character id) is longer than a Unix socket
        # address may be: it is reached through a descriptor of its folder, as runsc does.
        try:
            folder = os.open(self.root, os.O_PATH | os.O_DIRECTORY)
        except OSError as exc:
            raise ControlError(f"runsc root {self.root}: {exc}") from exc
        try:
            return await asyncio.open_unix_connection(
                f"/proc/self/fd/{folder}/runsc-{self.sandbox_id}.sock")
        except OSError as exc:
            raise ControlError(f"control socket of sandbox {self.sandbox_id}: {exc}") from exc
        finally:
            os.close(folder)

    async def call(self, method: str, arg: Any) -> Any:
        """One call: its result, or ControlError."""
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                reader, writer = await self._connect()
                try:
                    writer.write(json.dumps({"method": method, "arg": arg}).encode())
                    await writer.drain()
                    answer = await _read_answer(reader)
                finally:
                    writer.close()
        except (TimeoutError, OSError) as exc:
            raise ControlError(f"{method} on sandbox {self.sandbox_id}: "
                               f"{exc or 'no answer in time'}") from exc
        if not isinstance(answer, dict) or answer.get("success") is not True:
            error = answer.get("err") if isinstance(answer, dict) else answer
            raise ControlError(f"{method} on sandbox {self.sandbox_id}: {error}")
        return answer.get("result")

    async def _table(self, container_id: str) -> list[Any]:
        result = await self.call("containerManager.Processes", container_id)
        if not isinstance(result, list):
            raise ControlError(f"unexpected process table {str(result)[:200]}")
        return result

    async def processes(self, container_id: str) -> dict[int, int]:
        """pid -> parent pid of every process in the container, as gVisor numbers them."""
        found = {}
        for process in await self._table(container_id):
            pid = process.get("pid") if isinstance(process, dict) else None
            parent = process.get("ppid") if isinstance(process, dict) else None
            if isinstance(pid, int) and isinstance(parent, int):
                found[pid] = parent
        return found

    async def pause(self) -> None:
        """Stop every task of the sandbox where it stands; returns once all have stopped
        (``runsc pause``'s call). Pauses nest: each needs its :meth:`resume`."""
        await self.call("containerManager.Pause", {})

    async def resume(self) -> None:
        """End one :meth:`pause` (never call it without one: gVisor's kernel panics)."""
        await self.call("containerManager.Resume", {})

    async def execs_named(self, container_id: str, name: str) -> list[int]:
        """The pids of the processes the engine started (parent 0) whose name (their
        ``comm``) is ``name``."""
        return [process["pid"] for process in await self._table(container_id)
                if isinstance(process, dict) and process.get("ppid") == 0
                and process.get("cmd") == name and isinstance(process.get("pid"), int)]

    async def kill(self, container_id: str, pid: int, signum: int = signal.SIGKILL) -> None:
        """A signal (SIGKILL unless told) to one process of the container (ControlError when
        it is gone)."""
        await self.call("containerManager.Signal", {
            "CID": container_id, "Signo": int(signum), "PID": pid,
            "Mode": 0})  # 0: deliver to that process only (runsc kill --pid)


async def _read_answer(reader: asyncio.StreamReader) -> Any:
    """One JSON value from a stream the server keeps open (there is no length prefix: the
    value ends where it parses)."""
    received = b""
    while len(received) < MAX_ANSWER_BYTES:
        chunk = await reader.read(65536)
        if not chunk:
            raise ControlError(f"the sentry closed the connection after {len(received)} bytes")
        received += chunk
        try:
            return json.loads(received)
        except ValueError:
            continue  # not all of it yet
    raise ControlError(f"an answer over {MAX_ANSWER_BYTES} bytes")
