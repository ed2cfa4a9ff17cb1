"""A session's code contexts: kernels of other languages beside its own Python one.
"""

from __future__ import annotations

import shlex

from kernel_pool._context_code import FOLDER_CHECK, check_cwd, folder_refusal
from kernel_pool._contexts import (
    ContextInfo,
    close_context,
)
from kernel_pool._languages import check_language
from kernel_pool._session_watch import SessionWatching
from kernel_pool.exceptions import (
    InvalidRequest,
    SessionClosed,
)


class SessionContexts(SessionWatching):
    """List, create, restart and remove code contexts."""

    async def list_contexts(self) -> list[ContextInfo]:
        """The session's code contexts, its own Python kernel first."""
        return [context.info(self.execution_count if context.default else None)
                for context in self._contexts]

    async def create_context(self, language: str | None = None,
                             cwd: str | None = None) -> ContextInfo:
        """A new code context of ``language`` (its kernel starts at its first execution, in
        the folder ``cwd``: None, the workspace; a relative one is in the workspace).
        :class:`InvalidRequest` for a folder that is not there or not the sandbox user's to
        enter (asked of the sandbox now, not at the first execution)."""
        if self._closed:
            raise SessionClosed(self.id)
        folder = check_cwd(cwd)
        check_language(language, self.languages)
        if folder is not None:
            checked = await self.run_command(f"sh -c {shlex.quote(FOLDER_CHECK)} - "
                                             f"{shlex.quote(folder)}", timeout_s=30)
            why = folder_refusal(folder, checked.stdout)
            if why is not None:
                raise InvalidRequest(why)
        return self._contexts.create(language, self.languages, folder).info()

    async def restart_context(self, context_id: str) -> None:
        """A fresh kernel for one context (its variables gone, files and other contexts
        kept); the session's own (``python``) is :meth:`restart`."""
        context = self._contexts.get(context_id)
        if context.default:
            await self.restart()
            return
        if self._closed:
            raise SessionClosed(self.id)
        self._interrupt(context_id)
        async with self._lock:
            # Ended now, started at its next execution: no kernel runs unasked.
            await close_context(context)
            context.lost = None

    async def remove_context(self, context_id: str) -> None:
        """End a context's kernel and forget the context (not the session's own)."""
        context = self._contexts.pop(context_id)
        for handle in self._queue:
            if handle.context_id == context_id and handle.run is None:
                handle.withdrawn = "withdrawn: its code context was removed before it ran"
        self._interrupt(context_id)
        async with self._lock:
            await close_context(context)
