"""A session's workspace files and the shell commands run beside its kernel, and its
sandbox's figures.
"""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Callable

from kernel_pool._commands import CommandEmit, CommandRun
from kernel_pool._egress import EgressAttempt
from kernel_pool._entries import Entry, FileInfo, split_relative
from kernel_pool._network import NetworkPolicy
from kernel_pool._resuming import SessionResuming
from kernel_pool._usage import SandboxUsage, read_usage
from kernel_pool._workspace import OLD_SANDBOX_PATH, SANDBOX_PATH
from kernel_pool.events import CommandResult, PtySize
from kernel_pool.exceptions import (
    BackendError,
    CommandNotFound,
    InvalidRequest,
    SessionClosed,
    TooManyCommands,
)
from kernel_pool.state import SessionStatus


class SessionFiles(SessionResuming):
    """Files, commands, usage and egress."""

    def prepare_command(self, command: str, *, timeout_s: float | None = None,
                        env: dict[str, str] | None = None, cwd: str | None = None,
                        command_id: str | None = None, stdin: bool = False,
                        pty: PtySize | None = None) -> CommandRun:
        """Check a shell command's request; the run to pass to :meth:`run_prepared`.

        Commands run beside the kernel, not in the execution queue: one may run while code
        does (at most ``max_commands`` per session at once). ``cwd`` is a workspace folder,
        or an absolute path elsewhere in the sandbox (its own folders, ``/`` too).
        """
        if self._closed or self.status is SessionStatus.DEAD:
            raise SessionClosed(self.id)
        if not command.strip():
            raise InvalidRequest("cmd is empty; send the shell command to run, e.g. 'ls -la'")
        if "\x00" in command:
            raise InvalidRequest("cmd contains a NUL character, which a shell cannot take")
        timeout = self.profile.timeout_for(timeout_s)
        for root in (SANDBOX_PATH, OLD_SANDBOX_PATH):  # the path as the sandbox sees it
            if cwd is not None and (cwd == root or cwd.startswith(f"{root}/")):
                cwd = cwd.removeprefix(root).lstrip("/")
        if cwd is not None and cwd.startswith("/"):
            folder = posixpath.normpath(cwd).replace("//", "/", 1)
        else:
            folder = "/".join(split_relative(cwd)) if cwd not in (None, "", ".") else ""
        if len(self.commands) >= self._settings.max_commands:
            raise TooManyCommands(self.id, self._settings.max_commands)
        command_id = command_id or f"cmd-{uuid.uuid4().hex}"
        if command_id in self.commands:
            raise InvalidRequest(f"command id {command_id!r} is already running")
        return CommandRun(self.kernel.sandbox, command, command_id=command_id,
                          timeout_s=timeout, caps=self.profile.caps,
                          env={**self.kernel.proxy_env(), **self.env, **(env or {})},
                          cwd=folder, stdin=stdin, pty=pty)

    async def kill_command(self, command_id: str) -> bool:
        """Stop a running command and its process group; False when none runs under that id."""
        run = self.commands.get(command_id)
        return run is not None and run.kill()

    async def run_command(self, command: str, *, timeout_s: float | None = None,
                          env: dict[str, str] | None = None, cwd: str | None = None,
                          command_id: str | None = None,
                          emit: CommandEmit | None = None,
                          on_start: Callable[[], None] | None = None,
                          stdin: bool = False, pty: PtySize | None = None) -> CommandResult:
        """Run a shell command to its end (:meth:`prepare_command` says what is refused);
        ``emit`` is told of its output as it comes; its aggregate result."""
        run = self.prepare_command(command, timeout_s=timeout_s, env=env, cwd=cwd,
                                   command_id=command_id, stdin=stdin, pty=pty)
        return await self.run_prepared(run, emit, on_start)

    def _command(self, command_id: str) -> CommandRun:
        run = self.commands.get(command_id)
        if run is None:
            raise CommandNotFound(self.id, command_id)
        return run

    async def send_command_input(self, command_id: str, data: bytes) -> None:
        """Write to a running command's stdin or terminal (see :class:`SessionPort`)."""
        await self._command(command_id).write(data)

    async def close_command_input(self, command_id: str) -> None:
        """Close a running command's stdin."""
        await self._command(command_id).close_input()

    async def resize_command(self, command_id: str, size: PtySize) -> None:
        """Resize a running command's terminal."""
        await self._command(command_id).resize(size)

    async def run_prepared(self, run: CommandRun, emit: CommandEmit | None = None,
                           on_start: Callable[[], None] | None = None) -> CommandResult:
        """Run a command from :meth:`prepare_command` to its end; its aggregate result.
        ``on_start`` is called once :meth:`kill_command` can reach it by its id."""
        if run.id in self.commands:
            raise InvalidRequest(f"command id {run.id!r} is already running")
        if self.paused:  # a command runs in the sandbox's container: bring it back first
            await self.resume()
            run.sandbox = self.kernel.sandbox  # a resume may have moved it to a new sandbox
        self.commands[run.id] = run
        self._touch()
        try:
            if on_start is not None:
                on_start()
            done = await run.run(emit or (lambda _event: None))
        finally:
            self.commands.pop(run.id, None)
            self._touch()
        if self._closed:
            # Its sandbox went away under it: not an exit of the command's own.
            raise SessionClosed(self.id)
        return run.result(done)

    async def read_file(self, path: str, limit: int) -> bytes:
        """The bytes of ``path`` in the workspace; :class:`FileMissing`, :class:`FileTooLarge`
        over ``limit`` bytes, :class:`PathOutsideWorkspace` for a path leaving it."""
        return await self._in_workspace(self.workspace.read_bytes, path, limit)

    async def write_file(self, path: str, data: bytes,
                         metadata: dict[str, str] | None = None) -> int:
        """Create or replace ``path`` (parent folders too); the number of bytes written.
        ``metadata`` becomes the file's only metadata (none clears an earlier write's);
        :class:`InvalidRequest` for keys or values the workspace refuses."""
        return await self._in_workspace(self.workspace.write_bytes, path, data, metadata)

    async def list_files(self) -> list[FileInfo]:
        """Every regular file of the workspace, recursively, paths relative to it."""
        return await self._in_workspace(self.workspace.list_files)

    async def stat_path(self, path: str) -> Entry:
        """What is at ``path`` (``""``: the workspace), with its metadata; a link is followed
        while it stays in the workspace, else described as itself."""
        return await self._in_workspace(self.workspace.stat, path)

    async def list_dir(self, path: str, depth: int = 1) -> list[Entry]:
        """The entries under the folder ``path``, ``depth`` levels down, depth first."""
        return await self._in_workspace(self.workspace.list_dir, path, depth)

    async def make_dir(self, path: str) -> bool:
        """Create the folder and its parents; False when it already exists."""
        return await self._in_workspace(self.workspace.make_dir, path)

    async def remove_path(self, path: str) -> None:
        """Delete a file, a link or a folder with everything in it."""
        await self._in_workspace(self.workspace.remove, path)

    async def move_path(self, source: str, destination: str) -> Entry:
        """Rename ``source`` to ``destination`` (its parent folders are created)."""
        return await self._in_workspace(self.workspace.move, source, destination)

    async def usage(self) -> SandboxUsage:
        """The sandbox's CPU time, memory and workspace disk in use now, and its limits;
        :class:`SessionClosed` if the session was deleted meanwhile (its workspace gone)."""
        return await self._while_open(
            lambda: read_usage(self.kernel.sandbox, self.workspace, self.profile, self.paused),
            (OSError, BackendError))

    async def egress_attempts(self) -> list[EgressAttempt]:
        """The latest connection attempts through the sandbox's egress proxy (none without)."""
        egress = self.kernel.egress
        return egress.attempts if egress is not None else []

    @property
    def network(self) -> NetworkPolicy | None:
        """The session's network policy (None: its profile's ``egress_allow``, if any)."""
        return self.kernel.network

    async def set_network(self, policy: NetworkPolicy | None) -> None:
        """Apply a network policy to the next connections (the caller checked its bound:
        every attempt is decided within the profile's bound anyway). It stays with the
        session across restarts, pauses and resumes."""
        if self._closed:
            raise SessionClosed(self.id)
        await self.kernel.set_network(policy, self.id)
