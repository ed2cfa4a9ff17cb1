"""Variables snapshots: what a paused session keeps of its kernel, and how forks are seeded.

A snapshot is the user namespace pickled with dill by the kernel itself
(``replgate_kernel.snapshot`` in the sandbox image), streamed as it is written through a named
pipe in the sandbox's socket folder (a hidden file in its workspace where a pipe cannot cross,
under gVisor), compressed on the way (:mod:`kernel_pool._streams`), and kept in
``<state dir>/snapshots``, a folder only the gateway's user can read (mode 0700, files 0600)
and that no sandbox mounts. Neither side holds the whole of it in memory: the kernel writes
its arrays' buffers straight from their own memory, and the gateway moves a megabyte at a
time. The gateway never unpickles a snapshot: only a kernel of the same session (or of its
fork) loads it.

This keeps variables, not processes: threads, open sockets and generators are listed in
``not_kept`` and the running state of a process (``/tmp``, a background thread) is not kept.
The session says so (``paused_with: "variables"``).

A memory pause (``REPLGATE_PAUSE_WITH=memory``) keeps, beside the variables snapshot, a
checkpoint of the whole sandbox (every process, thread, open file, ``/tmp``) made by the
backend: ``<key>.memory.*`` in the same folder, under the same budget, deleted with it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import anyio.to_thread

from kernel_pool._chunk_files import FileChunkReader, FileChunkWriter
from kernel_pool._streams import SUFFIXES, ChunkReader, Progress, copy
from kernel_pool._variables import load_stream, save_stream
from kernel_pool.exceptions import SnapshotBudgetExceeded, SnapshotError
from kernel_pool.state import PauseInfo

if TYPE_CHECKING:
    from kernel_pool._kernel import Kernel

MEMORY_INFIX = ".memory"
"""A memory image is ``<key>.memory.<the backend's suffix>``."""
STOPPED_COMMAND = "command "
"""How a ``not_kept`` entry of a shell command a pause stopped begins (no pause keeps one)."""
STOPPED_CONTEXT = "context "
"""How a ``not_kept`` entry of a code context a pause ended begins (a variables pause keeps
none but the session's Python kernel; a memory pause keeps those it can,
:class:`~kernel_pool.state.KeptContext`)."""


def context_entry(context_id: str) -> str:
    """A code context's name in ``not_kept``."""
    return f"{STOPPED_CONTEXT}{context_id!r}"


class SnapshotStore:
    """Compressed snapshots in one private folder, with a size budget."""

    def __init__(self, root: Path, budget_bytes: int) -> None:
        self.root = root
        self.budget_bytes = budget_bytes
        self._budget_lock = threading.Lock()
        self._used_at_most: int | None = None
        """What the snapshots take, or more: a scan's figure plus every save since (deletions
        are not taken off). The folder is scanned again only when a save would not fit in
        it, so the budget's verdict is exact while a save costs no scan of thousands."""
        self._held: dict[str, int] = {}
        """The memory dumps not packed yet, by key: their bytes, outside this folder (the
        backend's), counted against the budget until they are packed or deleted."""

    def _path(self, key: str, suffix: str) -> Path:
        if not key or "/" in key or key.startswith("."):
            raise SnapshotError(f"bad snapshot key {key!r}")
        return self.root / f"{key}{suffix}"

    def _ensure_root(self) -> None:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)

    def used_bytes(self) -> int:
        """What every snapshot takes on disk now, memory dumps not packed yet included
        (blocking)."""
        total = sum(self._held.values())
        if not self.root.is_dir():
            return total
        with os.scandir(self.root) as entries:
            for entry in entries:
                # Saves and deletions run beside this one (a fork writes its copies' snapshots
                # at once): a file may go (``.part`` renamed) between the listing and its stat.
                with contextlib.suppress(FileNotFoundError):
                    if entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
        return total

    def _reserve(self, size: int) -> None:
        """Count ``size`` more bytes being written against the budget, or
        :class:`SnapshotBudgetExceeded`."""
        with self._budget_lock:
            if self._used_at_most is None or self._used_at_most + size > self.budget_bytes:
                self._used_at_most = self.used_bytes()  # partial files as they are now
            if self._used_at_most + size > self.budget_bytes:
                raise SnapshotBudgetExceeded(
                    f"the snapshot does not fit in the budget of {self.budget_bytes} bytes "
                    "(REPLGATE_SNAPSHOT_BUDGET); delete sessions or raise it")
            self._used_at_most += size

    def open_write(self, key: str) -> FileChunkWriter:
        """A writer of the key's variables snapshot, counted against the budget as it goes;
        :meth:`commit` it with the info and how it is stored."""
        self._ensure_root()
        return FileChunkWriter(self._path(key, ""), self._reserve)

    def commit(self, key: str, writer: FileChunkWriter, info: PauseInfo,
               suffix: str) -> PauseInfo:
        """Make a written snapshot the key's, stored as ``suffix`` says (:data:`SUFFIXES`:
        as the pump stored it, or as another node did), with its info (its size and time
        added)."""
        if suffix not in SUFFIXES:
            writer.abort()
            raise SnapshotError(f"a snapshot stored as {suffix!r} cannot be read here")
        try:
            size = writer.commit(self._path(key, suffix))
            for other in SUFFIXES:  # an earlier snapshot of the key in another form
                if other != suffix:
                    self._path(key, other).unlink(missing_ok=True)
            info = info.model_copy(update={"image_bytes": size,
                                           "paused_at": datetime.now(UTC).isoformat()})
            _write_private(self._path(key, ".json"), info.model_dump_json().encode())
        except BaseException:
            self._path(key, suffix).unlink(missing_ok=True)
            raise
        return info

    def open_read(self, key: str) -> tuple[ChunkReader, str]:
        """The key's variables snapshot as stored, and how (its suffix)."""
        for suffix in SUFFIXES:
            path = self._path(key, suffix)
            if path.is_file():
                return FileChunkReader(path), suffix
        raise SnapshotError("the session's snapshot is missing")

    def copy(self, source: str, key: str, info: PauseInfo) -> PauseInfo:
        """The snapshot of ``source`` as ``key``'s too (a fork's paused copy), with ``info``."""
        reader, suffix = self.open_read(source)
        try:
            self._ensure_root()
            writer = FileChunkWriter(self._path(key, suffix), self._reserve)
            size = copy(reader, writer)
        finally:
            reader.close()
        info = info.model_copy(update={"image_bytes": size,
                                       "paused_at": datetime.now(UTC).isoformat()})
        try:
            _write_private(self._path(key, ".json"), info.model_dump_json().encode())
        except BaseException:
            self._path(key, suffix).unlink(missing_ok=True)
            raise
        return info

    def _snapshot_size(self, key: str) -> int:
        for suffix in SUFFIXES:
            with contextlib.suppress(OSError):
                return self._path(key, suffix).stat().st_size
        return 0

    def variables_only(self, key: str, info: PauseInfo) -> PauseInfo:
        """The key's memory pause ``info`` as its variables snapshot's alone, with that
        snapshot's size."""
        return info.without_memory().model_copy(
            update={"image_bytes": self._snapshot_size(key)})

    def remove_partials(self) -> int:
        """Remove the partial files (``*.part``) an earlier gateway, stopped or killed while
        writing them, left (blocking; before any write of this gateway); how many. Each is
        counted by :meth:`used_bytes` while it lies there, and nothing reads it."""
        if not self.root.is_dir():
            return 0
        removed = 0
        for path in self.root.glob("*.part"):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed += 1
        return removed

    def memory_stem(self, key: str) -> Path:
        """Where a backend writes the key's memory image (it adds its suffix), the folder made."""
        self._ensure_root()
        return self._path(key, MEMORY_INFIX)

    def memory_image(self, key: str) -> Path | None:
        """The key's memory image, if it has one."""
        found = sorted(self.root.glob(f"{self._path(key, MEMORY_INFIX).name}.*"))
        return next((path for path in found if not path.name.endswith(".part")), None)

    def hold_memory(self, key: str, size: int, info: PauseInfo) -> PauseInfo:
        """Count a memory dump of ``size`` bytes, not packed yet, against the budget and note
        the memory pause in the key's info (a gateway that stops before the packing ends
        finds no image, and resumes from the variables); :class:`SnapshotBudgetExceeded` when
        it does not fit (the caller discards the dump; the variables snapshot stays)."""
        with self._budget_lock:
            self._held.pop(key, None)
            used = self.used_bytes()
            if used + size > self.budget_bytes:
                self._used_at_most = used
                raise SnapshotBudgetExceeded(
                    f"the memory dump of {size} bytes does not fit in the budget of "
                    f"{self.budget_bytes} bytes (REPLGATE_SNAPSHOT_BUDGET)")
            self._held[key] = size
            self._used_at_most = used + size
        info = _with_memory(info, size)
        _write_private(self._path(key, ".json"), info.model_dump_json().encode())
        return info

    def drop_held(self, key: str) -> None:
        """The key's memory dump is gone (packed, restored or discarded): no longer counted."""
        with self._budget_lock:
            self._held.pop(key, None)

    def keep_memory(self, key: str, image: Path, info: PauseInfo) -> PauseInfo:
        """Count a memory image the backend wrote against the budget (in place of its dump,
        gone) and note it in the key's info (``info`` of the variables snapshot); over the
        budget it is deleted and :class:`SnapshotBudgetExceeded` raised (the variables
        snapshot stays)."""
        size = image.stat().st_size
        with self._budget_lock:
            self._held.pop(key, None)
            used = self.used_bytes()  # the image is in it already
            self._used_at_most = used
            if used > self.budget_bytes:
                image.unlink(missing_ok=True)
                self._used_at_most -= size
                raise SnapshotBudgetExceeded(
                    f"the memory image of {size} bytes does not fit in the budget of "
                    f"{self.budget_bytes} bytes (REPLGATE_SNAPSHOT_BUDGET)")
        info = _with_memory(info, size)
        _write_private(self._path(key, ".json"), info.model_dump_json().encode())
        return info

    def info(self, key: str) -> PauseInfo | None:
        try:
            return PauseInfo.model_validate_json(self._path(key, ".json").read_bytes())
        except (OSError, ValueError):
            return None

    def delete(self, key: str) -> None:
        self.drop_held(key)
        for suffix in (*SUFFIXES, ".json"):
            self._path(key, suffix).unlink(missing_ok=True)
        self.delete_memory(key)

    def save_info(self, key: str, info: PauseInfo) -> None:
        """Write the key's info again (a memory pause that fell back to its variables)."""
        _write_private(self._path(key, ".json"), info.model_dump_json().encode())

    def delete_memory(self, key: str) -> None:
        """Delete the key's memory image (its variables snapshot stays)."""
        self.drop_held(key)
        if self.root.is_dir():
            for path in self.root.glob(f"{self._path(key, MEMORY_INFIX).name}.*"):
                path.unlink(missing_ok=True)


def _with_memory(info: PauseInfo, size: int) -> PauseInfo:
    """The variables snapshot's info as a memory pause's, the memory's ``size`` added: what
    the variables lost the memory keeps (the code contexts it holds too), but for the shell
    commands and code contexts the pause stopped."""
    held = {context_entry(context.id) for context in info.contexts}
    stopped = {name: why for name, why in info.not_kept.items()
               if name.startswith((STOPPED_COMMAND, STOPPED_CONTEXT)) and name not in held}
    kept = [name for name in info.not_kept if name not in stopped]
    return info.model_copy(update={
        "paused_with": "memory", "image_bytes": info.image_bytes + size,
        "kept": [*info.kept, *kept], "not_kept": stopped,
        "variables_not_kept": {name: info.not_kept[name] for name in kept}})


def _write_private(path: Path, data: bytes) -> None:
    """Write ``path`` (0600) atomically; on failure no partial file is left, and
    :class:`SnapshotError` (:class:`SnapshotBudgetExceeded` on a full disk) gives the
    system's words without the path: the host's folders are not the tenant's to see."""
    partial = path.with_name(path.name + ".part")
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, path)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
    except OSError as exc:
        error = SnapshotBudgetExceeded if exc.errno in (errno.ENOSPC, errno.EDQUOT) \
            else SnapshotError
        raise error("the snapshot could not be written to the state directory: "
                    f"{exc.strerror or type(exc).__name__}") from exc


async def save_variables(kernel: Kernel, store: SnapshotStore, key: str,
                         progress: Progress | None = None) -> PauseInfo:
    """Stream the kernel's variables into the store as ``key``'s snapshot; what was kept
    (with the snapshot's size). The kernel goes on unchanged, also when this fails."""
    writer = await anyio.to_thread.run_sync(store.open_write, key)
    try:
        info, suffix = await save_stream(kernel, writer, progress)
        info = info.model_copy(update={"boot_id": kernel.sandbox.boot_id})
        committed: PauseInfo = await anyio.to_thread.run_sync(store.commit, key, writer, info,
                                                              suffix)
    except BaseException:
        writer.abort()
        raise
    return committed


async def load_variables(kernel: Kernel, store: SnapshotStore, key: str, reseed: bool,
                         progress: Progress | None = None) -> None:
    """Stream ``key``'s snapshot into the kernel's namespace (``reseed``: fresh random
    generators, for a fork's copy)."""
    reader, suffix = await anyio.to_thread.run_sync(store.open_read, key)
    try:
        await load_stream(kernel, reader, suffix, reseed, progress)
    finally:
        reader.close()


# Pipes are made by the host in a folder the sandbox can write: each end is opened without
# following a link, and checked to be the very pipe made (a planted file is refused).
