"""The files of a session's workspace: write, read, list (paths relative to the workspace)."""

from __future__ import annotations

import builtins
from urllib.parse import quote

from gateway.wire import FileInfo, FileWritten

from ._transport import Transport


class AsyncFiles:
    """The workspace of one session, as ``sandbox.files``.

    Paths are relative to the workspace (``data/in.bin``); a path leaving it is refused with
    :class:`InvalidRequestError`.
    """

    def __init__(self, transport: Transport, session_path: str) -> None:
        self._transport = transport
        self._base = f"{session_path}/files"

    async def write(self, path: str, data: bytes | str) -> FileWritten:
        """Create or replace ``path`` (parent folders too); ``str`` data is written as UTF-8."""
        content = data.encode() if isinstance(data, str) else data
        response = await self._transport.request("PUT", self._file(path), content=content)
        return FileWritten.model_validate(response.json())

    async def read(self, path: str) -> bytes:
        """The content of ``path``; :class:`NotFoundError` if there is no such file."""
        response = await self._transport.request("GET", self._file(path))
        return response.content

    async def list(self) -> builtins.list[FileInfo]:
        """Every file of the workspace, recursively."""
        response = await self._transport.request("GET", self._base)
        return [FileInfo.model_validate(item) for item in response.json()]

    def _file(self, path: str) -> str:
        # Quoted so that "?", "#" or "%" stay part of the name; "/" keeps separating folders.
        # "." and ".." segments are encoded too: left bare, URL normalisation would resolve them
        # here, sending another path instead of letting the gateway refuse it (400).
        segments = [quote(part, safe="") if part not in (".", "..") else part.replace(".", "%2E")
                    for part in path.split("/")]
        return f"{self._base}/{'/'.join(segments)}"
