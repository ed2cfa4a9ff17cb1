"""A session's folders watched: ``watch_dir``, served by the watcher in its sandbox."""

from __future__ import annotations

from kernel_pool._entries import split_relative
from kernel_pool._session_files import SessionFiles
from kernel_pool._watch import DirWatch, SandboxWatch
from kernel_pool.exceptions import SessionClosed, TooManyWatches, WorkspaceError
from kernel_pool.state import SessionStatus


class SessionWatching(SessionFiles):
    """Watching folders of the workspace."""

    async def watch_dir(self, path: str, recursive: bool = False, *,
                        watch_id: str | None = None) -> DirWatch:
        """Watch the folder ``path`` (``""``: the workspace), and with ``recursive`` every
        folder below it, those made later too; the watch, once in place. At most
        ``max_watches`` at once (:class:`TooManyWatches`); :class:`FileMissing` or
        :class:`WorkspaceError` for a path that is not a folder. A paused session is resumed
        first (the watcher runs in its sandbox); a pause or the session's end ends the watch.
        A watch is not a command: it does not count as activity or against ``max_commands``.
        ``watch_id`` names it (a node's gateway names its watches)."""
        if self._closed or self.status is SessionStatus.DEAD:
            raise SessionClosed(self.id)
        folder = "/".join(split_relative(path)) if path not in ("", ".") else ""
        if (await self.stat_path(folder)).kind != "dir":  # a link too: it is not followed
            raise WorkspaceError(f"{path!r} is not a folder")
        if len(self.watches) >= self._settings.max_watches:
            raise TooManyWatches(self.id, self._settings.max_watches)
        if self.paused:
            await self.resume()
        process = await self.kernel.sandbox.start_watch(folder, recursive)
        watch = SandboxWatch(folder, recursive, process, watch_id=watch_id)
        if len(self.watches) >= self._settings.max_watches:  # others started meanwhile
            await watch.close()
            raise TooManyWatches(self.id, self._settings.max_watches)
        self.watches[watch.id] = watch
        watch.on_end.append(lambda ended: self.watches.pop(ended.id, None))
        try:
            await watch.start()
        except BaseException:
            self.watches.pop(watch.id, None)
            raise
        if self._closed:  # deleted while it started
            await watch.close("the session was deleted")
        return watch
