"""Variables snapshots: what a paused session keeps of its kernel, and how forks are seeded.

A snapshot is the user namespace pickled with dill by the kernel itself
(``replgate_kernel.snapshot`` in the sandbox image), passed through a hidden file in the
session's own workspace, and kept compressed in ``<state dir>/snapshots``, a folder only the
gateway's user can read (mode 0700, files 0600) and that no sandbox mounts. The gateway never
unpickles a snapshot: only a kernel of the same session (or of its fork) loads it.

This keeps variables, not processes: threads, open sockets and generators are listed in
``not_kept`` and the running state of a process (``/tmp``, a background thread) is not kept.
The session says so (``paused_with: "variables"``).

A memory pause (``REPLGATE_PAUSE_WITH=memory``) keeps, beside the variables snapshot, a
checkpoint of the whole sandbox (every process, thread, open file, ``/tmp``) made by the
backend: ``<key>.memory.*`` in the same folder, under the same budget, deleted with it.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import errno
import json
import os
import secrets
import stat
import threading
import zlib
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio.to_thread
from pydantic import BaseModel, Field

from kernel_pool._workspace import SANDBOX_GID, SANDBOX_UID, Workspace
from kernel_pool.exceptions import SnapshotBudgetExceeded, SnapshotError, WorkspaceError

if TYPE_CHECKING:
    from kernel_pool._kernel import Kernel

try:  # zstd is faster and smaller where the module is installed; zlib is always there
    import zstandard
except ImportError:  # pragma: no cover (depends on the environment)
    zstandard = None

SNAPSHOT_SUFFIX = ".zst" if zstandard is not None else ".zlib"
MEMORY_INFIX = ".memory"
"""A memory image is ``<key>.memory.<the backend's suffix>``."""
TRANSFER_NAME = ".replgate-snapshot"
"""The hidden workspace file a snapshot passes through (a random suffix is added)."""
SNAPSHOT_TIMEOUT_S = 120.0
STOPPED_COMMAND = "command "
"""How a ``not_kept`` entry of a shell command a pause stopped begins (no pause keeps one)."""


class PauseInfo(BaseModel):
    """What a paused session kept, said honestly."""

    paused_with: Literal["memory", "variables"] = "variables"
    """"variables": the user namespace was kept (dill), not the process (threads, /tmp);
    "memory": the whole sandbox was checkpointed as well (the variables snapshot stays, for
    a restore that fails)."""
    kept: list[str] = Field(default_factory=list)
    not_kept: dict[str, str] = Field(default_factory=dict)
    """What could not be kept, each with the reason: variables by name, ``thread 'name'``,
    ``/tmp/name``; with "memory" only the shell commands the pause stopped (``command '...'``,
    which no pause keeps)."""
    variables_not_kept: dict[str, str] = Field(default_factory=dict)
    """With "memory": the names the variables snapshot could not keep, lost only if the
    memory image cannot be restored (the resume then says so)."""
    image_bytes: int = 0
    """What the session's snapshot takes on disk (variables, and memory image if any)."""
    paused_at: str = ""
    reseed: bool = False
    """A fork's copy that never ran: its random generators start afresh when it resumes."""

    def without_memory(self) -> PauseInfo:
        """What the variables snapshot alone keeps of a memory pause (its image lost, or
        not for a fork's copy); ``image_bytes`` is left to the caller."""
        if self.paused_with != "memory":
            return self
        return self.model_copy(update={
            # (a memory pause's own not_kept: the shell commands it stopped, lost either way)
            "paused_with": "variables", "not_kept": {**self.variables_not_kept, **self.not_kept},
            "kept": [n for n in self.kept if n not in self.variables_not_kept],
            "variables_not_kept": {}})


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

    @staticmethod
    def compress(raw: bytes) -> bytes:
        """A snapshot as it is kept (blocking; a fork compresses once for all its copies)."""
        if zstandard is not None:
            data: bytes = zstandard.ZstdCompressor(level=1).compress(raw)
            return data
        return zlib.compress(raw, 1)

    def save(self, key: str, raw: bytes, info: PauseInfo) -> PauseInfo:
        """Compress and write ``raw`` with its info, atomically; the info with the size."""
        return self.save_compressed(key, self.compress(raw), info)

    def save_compressed(self, key: str, data: bytes, info: PauseInfo) -> PauseInfo:
        """Write ``data`` (from :meth:`compress`) with its info, atomically; the info with
        the size."""
        self._ensure_root()
        info = info.model_copy(update={"image_bytes": len(data),
                                       "paused_at": datetime.now(UTC).isoformat()})
        about = info.model_dump_json().encode()
        size = len(data) + len(about)
        with self._budget_lock:
            if self._used_at_most is None or self._used_at_most + size > self.budget_bytes:
                self._used_at_most = self.used_bytes()
            if self._used_at_most + size > self.budget_bytes:
                raise SnapshotBudgetExceeded(
                    f"the snapshot of {len(data)} bytes does not fit in the budget of "
                    f"{self.budget_bytes} bytes (REPLGATE_SNAPSHOT_BUDGET); delete sessions or "
                    "raise it")
            self._used_at_most += size
        written = []
        try:
            for path, content in ((self._path(key, SNAPSHOT_SUFFIX), data),
                                  (self._path(key, ".json"), about)):
                _write_private(path, content)
                written.append(path)
        except SnapshotError:  # a full disk, most likely: what was written is taken back
            for path in written:
                path.unlink(missing_ok=True)
            raise
        return info

    def load(self, key: str) -> bytes:
        """The uncompressed snapshot, or SnapshotError naming what is wrong with it."""
        path = self._path(key, SNAPSHOT_SUFFIX)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise SnapshotError(f"the session's snapshot cannot be read: {exc}") from exc
        try:
            if zstandard is not None:
                raw: bytes = zstandard.ZstdDecompressor().decompress(data)
                return raw
            return zlib.decompress(data)
        except Exception as exc:
            raise SnapshotError(f"the session's snapshot is corrupt: {exc}") from exc

    def variables_only(self, key: str, info: PauseInfo) -> PauseInfo:
        """The key's memory pause ``info`` as its variables snapshot's alone, with that
        snapshot's size."""
        try:
            size = self._path(key, SNAPSHOT_SUFFIX).stat().st_size
        except OSError:
            size = 0
        return info.without_memory().model_copy(update={"image_bytes": size})

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
        for suffix in (SNAPSHOT_SUFFIX, ".json"):
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
    the variables lost the memory keeps, but for the shell commands the pause stopped."""
    stopped = {name: why for name, why in info.not_kept.items()
               if name.startswith(STOPPED_COMMAND)}
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


# -- the kernel side, through silent executions ---------------------------------------------

async def evaluate(kernel: Kernel, expression: str, timeout_s: float) -> Any:
    """Evaluate ``expression`` in the kernel as a user expression of a silent execution
    (no history, no namespace change); its value, read back from its ``repr``."""
    msg_id, route = kernel.request("execute_request", {
        "code": "", "silent": True, "store_history": False,
        "user_expressions": {"r": expression}, "allow_stdin": False, "stop_on_error": False})
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                channel, msg = await route.get()
                if channel == "died":
                    raise SnapshotError(f"the kernel died: {msg.reason}")
                if channel == "shell":
                    break
    except TimeoutError:
        raise SnapshotError(f"the kernel did not answer within {timeout_s:g}s") from None
    finally:
        kernel.forget(msg_id)
    result = (msg["content"].get("user_expressions") or {}).get("r") or {}
    if result.get("status") != "ok":
        raise SnapshotError(f"{result.get('ename', 'error')}: {result.get('evalue', '')}"[:500])
    try:
        return ast.literal_eval(result["data"]["text/plain"])
    except (KeyError, ValueError, SyntaxError) as exc:
        raise SnapshotError(f"the kernel's answer was unreadable: {exc}") from exc


def _transfer_name() -> str:
    return f"{TRANSFER_NAME}-{secrets.token_hex(8)}"


def _take_file(workspace: Workspace, name: str, limit: int) -> bytes:
    try:
        return workspace.read_bytes(name, limit)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(workspace.root / name)  # unlink never follows a link


async def save_variables(kernel: Kernel, workspace: Workspace,
                         limit: int) -> tuple[bytes, PauseInfo]:
    """The kernel's variables (pickled) and what was kept; the kernel goes on unchanged."""
    name = _transfer_name()
    try:
        answer = await evaluate(
            kernel, f"__import__('replgate_kernel.snapshot').snapshot.save({name!r})",
            SNAPSHOT_TIMEOUT_S)
        summary = json.loads(answer)
        raw = await anyio.to_thread.run_sync(_take_file, workspace, name, limit)
    except WorkspaceError as exc:
        raise SnapshotError(f"the variables could not be read back: {exc}") from exc
    finally:
        with contextlib.suppress(OSError):
            await anyio.to_thread.run_sync(os.unlink, workspace.root / name)
    return raw, PauseInfo(kept=summary["kept"], not_kept=summary["not_kept"])


async def load_variables(kernel: Kernel, workspace: Workspace, raw: bytes,
                         reseed: bool) -> None:
    """Put pickled variables into the kernel (``reseed``: fresh random generators)."""
    name = _transfer_name()
    try:
        await anyio.to_thread.run_sync(workspace.write_bytes, name, raw)
    except WorkspaceError as exc:
        raise SnapshotError(f"the variables do not fit in the workspace: {exc}") from exc
    try:
        await evaluate(kernel, f"__import__('replgate_kernel.snapshot').snapshot.load("
                               f"{name!r}, {reseed!r})", SNAPSHOT_TIMEOUT_S)
    finally:
        with contextlib.suppress(OSError):
            await anyio.to_thread.run_sync(os.unlink, workspace.root / name)


# -- workspace copies for forks --------------------------------------------------------------

def copy_workspace(source: Workspace, target: Workspace) -> None:
    """Copy regular files, folders and symlinks (as links) from one workspace into another.

    Blocking. The source is written by sandboxed code, possibly while this runs: every entry
    is opened relative to its parent's descriptor without following links, and anything but
    a regular file, a folder or a link (a FIFO, a device) is skipped, so the copy never reads
    outside the source nor hangs.
    """
    with source.access(), target.access(write=True):
        src = os.open(source.root, os.O_RDONLY | os.O_DIRECTORY)
        dst = os.open(target.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _copy_tree(src, dst, depth=0)
        finally:
            os.close(src)
            os.close(dst)


MAX_COPY_DEPTH = 64


def _copy_tree(src: int, dst: int, depth: int) -> None:
    if depth > MAX_COPY_DEPTH:
        return
    for entry in os.scandir(src):
        name = entry.name
        if name.startswith(TRANSFER_NAME) or (depth == 0 and name == "lost+found"):
            continue
        try:
            info = os.stat(name, dir_fd=src, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(info.st_mode):
            with contextlib.suppress(OSError):
                os.symlink(os.readlink(name, dir_fd=src), name, dir_fd=dst)
                _own(name, dst)
        elif stat.S_ISDIR(info.st_mode):
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, stat.S_IMODE(info.st_mode) | 0o700, dir_fd=dst)
                _own(name, dst)
            child_src = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=src)
            try:
                child_dst = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                                    dir_fd=dst)
                try:
                    _copy_tree(child_src, child_dst, depth + 1)
                finally:
                    os.close(child_dst)
            finally:
                os.close(child_src)
        elif stat.S_ISREG(info.st_mode):
            _copy_file(name, src, dst, stat.S_IMODE(info.st_mode))


def _copy_file(name: str, src: int, dst: int, mode: int) -> None:
    try:
        fin = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=src)
    except OSError:
        return
    try:
        if not stat.S_ISREG(os.fstat(fin).st_mode):
            return
        fout = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode,
                       dir_fd=dst)
        try:
            while chunk := os.read(fin, 1 << 20):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fout, view):]
            if os.geteuid() == 0:
                os.fchown(fout, SANDBOX_UID, SANDBOX_GID)
        finally:
            os.close(fout)
    finally:
        os.close(fin)


def _own(name: str, dir_fd: int) -> None:
    if os.geteuid() == 0:
        os.chown(name, SANDBOX_UID, SANDBOX_GID, dir_fd=dir_fd, follow_symlinks=False)
