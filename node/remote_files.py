"""A remote session's workspace files, shell commands and sandbox readings: each a request to
the node that runs it.

:class:`SessionRequests` is the part of :class:`~node.remote.RemoteSession` that only asks its
node and answers what the node said (the rest, its queue, state and following, is in
:mod:`node.remote`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, TypeAdapter

from kernel_pool import (
    CommandEmit,
    CommandResult,
    DirWatch,
    EgressAttempt,
    Entry,
    FileInfo,
    InvalidRequest,
    NetworkPolicy,
    NodeUnreachable,
    PtySize,
    SandboxUsage,
    SessionClosed,
    SessionState,
    StreamEvent,
)
from node.client import NodeClient
from node.remote_watch import RemoteWatch
from node.wire import Killed, Made, Move, RunCommand, SetNetwork, Written, error_from

_FILES = TypeAdapter(list[FileInfo])
_EGRESS = TypeAdapter(list[EgressAttempt])
_ENTRIES = TypeAdapter(list[Entry])


class SessionRequests:
    """Requests about one session to its node, refused once the session is closed here."""

    id: str
    client: NodeClient
    _closed: bool
    _state: SessionState

    @property
    def node(self) -> str:
        return self.client.node_id

    async def _call(self, method: str, path: str, answer: type[BaseModel] | None = None,
                    **kwargs: Any) -> Any:
        """A request about the session to its node (:meth:`NodeClient.call`); refused here
        once the session is closed, as a closed local session refuses."""
        if self._closed:
            raise SessionClosed(self.id)
        return await self.client.call(method, path, answer, **kwargs)

    # -- files and commands -------------------------------------------------------------------

    async def read_file(self, path: str, limit: int) -> bytes:
        response = await self._call("GET", f"/sessions/{self.id}/file",
                                          session_id=self.id,
                                          params={"path": path, "limit": limit})
        content: bytes = response.content
        return content

    async def write_file(self, path: str, data: bytes,
                         metadata: dict[str, str] | None = None) -> int:
        params = {"path": path}
        if metadata:
            params["metadata"] = json.dumps(metadata)
        written: Written = await self._call(
            "PUT", f"/sessions/{self.id}/file", Written, session_id=self.id,
            params=params, content=data,
            headers={"content-type": "application/octet-stream"})
        return written.size

    async def list_files(self) -> list[FileInfo]:
        response = await self._call("GET", f"/sessions/{self.id}/files",
                                          session_id=self.id)
        return _FILES.validate_json(response.content)

    async def stat_path(self, path: str) -> Entry:
        entry: Entry = await self._call("GET", f"/sessions/{self.id}/entry", Entry,
                                              session_id=self.id, params={"path": path})
        return entry

    async def list_dir(self, path: str, depth: int = 1) -> list[Entry]:
        response = await self._call("GET", f"/sessions/{self.id}/dir", session_id=self.id,
                                          params={"path": path, "depth": depth})
        return _ENTRIES.validate_json(response.content)

    async def make_dir(self, path: str) -> bool:
        made: Made = await self._call("POST", f"/sessions/{self.id}/dir", Made,
                                            session_id=self.id, params={"path": path})
        return made.made

    async def remove_path(self, path: str) -> None:
        await self._call("DELETE", f"/sessions/{self.id}/entry", session_id=self.id,
                               params={"path": path})

    async def move_path(self, source: str, destination: str) -> Entry:
        entry: Entry = await self._call(
            "POST", f"/sessions/{self.id}/move", Entry, session_id=self.id,
            content=Move(source=source, destination=destination).model_dump_json(),
            headers={"content-type": "application/json"})
        return entry

    async def run_command(self, command: str, *, timeout_s: float | None = None,
                          env: dict[str, str] | None = None, cwd: str | None = None,
                          command_id: str | None = None,
                          emit: CommandEmit | None = None,
                          on_start: Callable[[], None] | None = None,
                          stdin: bool = False, pty: PtySize | None = None) -> CommandResult:
        if self._closed:
            raise SessionClosed(self.id)
        # Named here, so a kill can reach it before its first output comes back.
        request = RunCommand(command=command, command_id=command_id or f"cmd-{uuid.uuid4().hex}",
                             timeout_s=timeout_s, env=env, cwd=cwd, stdin=stdin, pty=pty)
        try:
            async with self.client.stream(f"/sessions/{self.id}/commands", request,
                                          self.id) as frames:
                # Read to the stream's end (it ends after the result): a response left
                # unread would close its connection.
                result: CommandResult | None = None
                async for frame in frames:
                    if frame.error is not None:
                        raise error_from(frame.error)
                    if isinstance(frame.event, StreamEvent) and emit is not None:
                        emit(frame.event)
                    elif frame.command_started is not None and on_start is not None:
                        on_start()
                    elif frame.command is not None:
                        result = frame.command
            if result is not None:
                return result
        except asyncio.CancelledError:
            # The closed stream stops it on the node too; the kill makes sure of it at once.
            with contextlib.suppress(Exception):
                await asyncio.shield(self.kill_command(request.command_id))
            raise
        raise NodeUnreachable(self.id, f"its node {self.node} ended the command's stream "
                              "before it was done")

    async def kill_command(self, command_id: str) -> bool:
        killed: Killed = await self._call(
            "POST", f"/sessions/{self.id}/commands/{command_id}/kill", Killed,
            session_id=self.id)
        return killed.killed

    async def send_command_input(self, command_id: str, data: bytes) -> None:
        await self._call("POST", f"/sessions/{self.id}/commands/{command_id}/input",
                         session_id=self.id, content=data,
                         headers={"content-type": "application/octet-stream"})

    async def close_command_input(self, command_id: str) -> None:
        await self._call("POST", f"/sessions/{self.id}/commands/{command_id}/close-input",
                         session_id=self.id)

    async def resize_command(self, command_id: str, size: PtySize) -> None:
        await self._call("POST", f"/sessions/{self.id}/commands/{command_id}/resize",
                         session_id=self.id, content=size.model_dump_json(),
                         headers={"content-type": "application/json"})

    async def watch_dir(self, path: str, recursive: bool = False, *,
                        watch_id: str | None = None) -> DirWatch:
        if self._closed:
            raise SessionClosed(self.id)
        watch = RemoteWatch(self.client, self.id, path, recursive, watch_id)
        await watch.start()
        return watch

    # -- the sandbox --------------------------------------------------------------------------

    async def usage(self) -> SandboxUsage:
        usage: SandboxUsage = await self._call(
            "GET", f"/sessions/{self.id}/usage", SandboxUsage, session_id=self.id)
        return usage

    async def egress_attempts(self) -> list[EgressAttempt]:
        response = await self._call("GET", f"/sessions/{self.id}/egress",
                                          session_id=self.id)
        return _EGRESS.validate_json(response.content)

    # -- its network policy, applied on its node (whose proxy serves it) ----------------------

    @property
    def network(self) -> NetworkPolicy | None:
        return self._state.network

    async def set_network(self, policy: NetworkPolicy | None) -> None:
        if policy is not None and policy.rules and not self.client.brokers_secrets:
            # (its node would ask this gateway for the secrets, and get none)
            raise InvalidRequest("secret rules need the gateway's secrets "
                                 "(REPLGATE_SECRETS_KEY)")
        state: SessionState = await self._call(
            "PUT", f"/sessions/{self.id}/network", SessionState, session_id=self.id,
            json=SetNetwork(policy=policy).model_dump(mode="json"))
        self._state = state
