"""A memory image's archive: a dump's folder packed into one 0600 file (``tar``, compressed with
``zstd -1`` where the host has it, else ``gzip -1``; stored as it is when samples of its pages
do not shrink), its records (``replgate.json``) first so that a restore reads them before the
rest, and unpacked again. Packing runs after the pause has answered and may be cancelled; a
stop signal to the gateway does not cut it short.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tarfile
import threading
from pathlib import Path, PurePosixPath
from typing import Any

from kernel_pool._streams import shrinks

ABOUT_NAME = "replgate.json"
ZSTD = shutil.which("zstd")
COMPRESSOR = [ZSTD, "-1", "-q", "-T0"] if ZSTD else ["gzip", "-1"]
"""zstd -1 packed a 93 MB checkpoint of a kernel to 23 MB in 0.30 s on the development machine;
gzip -1 to 26 MB in 1.5 s (docs/checkpoint.md)."""
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
"""What stops a gateway, and must not stop its packing (see :class:`Packing`)."""
IMAGE_SUFFIXES = (".tar.zst", ".tar.gz", ".tar")
"""The names a checkpoint archive may have (after the session's id), the one made here first."""
IMAGE_SUFFIX = IMAGE_SUFFIXES[0] if ZSTD else IMAGE_SUFFIXES[1]
STORED_SUFFIX = IMAGE_SUFFIXES[2]
"""An archive stored as it is: its files are copied out within the kernel at the restore. 1 GiB
of random floats came out of ``zstd -dc | tar -x`` in 1.0-1.8 s here, and read from the
disk in 0.35-0.55 s: the pipe and tar's small writes cost more than the disk."""
SAMPLES, SAMPLE_BYTES = 16, 64 << 10
"""Where the dump's largest file is sampled for :func:`worth_compressing`."""
WORTH_AT_MOST = 2 / 3
"""A dump is compressed when its samples shrink to this share of their size at most: the
unpacking pipes every byte, compressed or not, so a little saved on disk is not worth it."""
RECORD_BLOCKS = 2048
"""tar's records of an archive stored as it is: 1 MiB (its default, 10 KiB, is a write each).
Not for a compressed one: ``tar -x`` stops at the archive's end, and the unpacker would be
cut off in the padding."""


class CheckpointError(Exception):
    """A dump, a packing or a restore failed; the message says which, with the engine's words."""


class Packing:
    """The packing of :func:`dump`'s folder into one 0600 archive, ``stem`` + the archive's
    suffix; :meth:`cancel` (from any thread) stops it, its partial file removed. The folder
    is left to the caller either way."""

    def __init__(self, folder: Path, stem: Path) -> None:
        self.folder = folder
        self.stem = stem
        self.image = stem.with_name(stem.name + IMAGE_SUFFIX)
        """The archive: its name is settled by :meth:`run` (compressed or not)."""
        self._lock = threading.Lock()
        self._processes: list[subprocess.Popen[bytes]] = []
        self._cancelled = False

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            for process in self._processes:
                with contextlib.suppress(OSError):
                    process.kill()

    def _names(self) -> list[str]:
        others = sorted(name for name in os.listdir(self.folder) if name != ABOUT_NAME)
        return [ABOUT_NAME, *others] if (self.folder / ABOUT_NAME).exists() else others

    def run(self) -> Path:
        """Pack (blocking); the archive. :class:`CheckpointError` when it failed or was
        cancelled."""
        compress = worth_compressing(self.folder)
        if not compress:
            self.image = self.stem.with_name(self.stem.name + STORED_SUFFIX)
        partial = self.image.with_name(self.image.name + ".part")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            with self._lock:
                if self._cancelled:
                    raise CheckpointError("the packing was cancelled")
                # A stop signal to the gateway (its process group, a stop, ^C, or every
                # process of its cgroup under systemd) must not cut the packing short: the
                # gateway's stop waits for it, and only cancel() ends it (SIGKILL). Sessions
                # of their own keep tar and zstd out of the group; and since a child is in the
                # group until its setsid(), they start, and run, with those signals blocked
                # (ci23: a SIGTERM in that window killed tar).
                blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
                try:
                    # The records first: a restore reads them before the rest is unpacked.
                    tar = subprocess.Popen(
                        ["tar", "-C", str(self.folder), "-cf", "-",
                         *([] if compress else ["-b", str(RECORD_BLOCKS)]),
                         "--", *self._names()],
                        stdout=subprocess.PIPE if compress else fd, stderr=subprocess.PIPE,
                        start_new_session=True)
                    self._processes = [tar]
                    if compress:
                        assert tar.stdout is not None
                        self._processes.append(subprocess.Popen(
                            COMPRESSOR, stdin=tar.stdout, stdout=fd, stderr=subprocess.PIPE,
                            start_new_session=True))
                        tar.stdout.close()
                finally:
                    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            names = ["tar", Path(COMPRESSOR[0] or "").name][:len(self._processes)]
            said = {name: (process.communicate()[1], process.returncode) for name, process
                    in reversed(list(zip(names, self._processes, strict=True)))}
            if self._cancelled:
                raise CheckpointError("the packing was cancelled")
            if any(code for _, code in said.values()):
                words = next((err for err, _ in said.values() if err), b""
                             ).decode(errors="replace").strip()[-300:]
                codes = ", ".join(f"{name}: {code}" for name, (_, code) in said.items())
                raise CheckpointError(f"packing failed ({codes}){': ' + words if words else ''}")
            os.fsync(fd)
        except BaseException:
            os.unlink(partial)
            raise
        finally:
            os.close(fd)
        os.replace(partial, self.image)
        return self.image



def worth_compressing(folder: Path) -> bool:
    """Whether a dump is worth compressing: samples of its largest file (the kernel's pages)
    shrink to :data:`WORTH_AT_MOST` with a fast codec. A kernel's heap does (a template's 93 MB
    to 23 MB); random floats do not, and storing them compressed only slows their restore."""
    files = [path for path in folder.rglob("*") if path.is_file() and not path.is_symlink()]
    if not files:
        return True
    largest = max(files, key=lambda path: path.stat().st_size)
    size = largest.stat().st_size
    if size <= SAMPLES * SAMPLE_BYTES:
        return True  # small: its size matters more than the milliseconds
    fd = os.open(largest, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        step = (size - SAMPLE_BYTES) // (SAMPLES - 1)
        samples = [os.pread(fd, SAMPLE_BYTES, k * step) for k in range(SAMPLES)]
    finally:
        os.close(fd)
    return shrinks(samples, WORTH_AT_MOST)


def unpack(image: Path, folder: Path) -> None:
    if image.name.endswith(STORED_SUFFIX):
        _copy_out(image, folder)
        return
    fd = os.open(image, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        # Chosen by the name, not by what the host has now: zstd may have come or gone since.
        program = (ZSTD or "zstd") if image.name.endswith(".zst") else "gzip"
        unpacker = subprocess.Popen([program, "-dc"], stdin=fd, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
        assert unpacker.stdout is not None
        tar = subprocess.run(["tar", "-C", str(folder), "--no-same-owner", "-xf", "-"],
                             stdin=unpacker.stdout, capture_output=True)
        unpacker.stdout.close()
        _, unpack_err = unpacker.communicate()
    finally:
        os.close(fd)
    if unpacker.returncode or tar.returncode:
        raise CheckpointError("the checkpoint image is corrupt: "
                              f"{(unpack_err or tar.stderr).decode(errors='replace')[-300:]}")



def _copy_out(image: Path, folder: Path) -> None:
    """Unpack an archive stored as it is: each file's bytes copied from the archive into the
    folder within the kernel (``copy_file_range``). Only plain files and folders below
    ``folder`` are made; anything else says the image is corrupt."""
    try:
        with open(image, "rb") as source, tarfile.open(fileobj=source, mode="r:") as archive:
            for member in archive:
                target = folder.joinpath(*_inside(member.name))
                if member.isdir():
                    target.mkdir(mode=0o700, parents=True, exist_ok=True)
                elif member.isfile():
                    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                    _copy_range(source.fileno(), target, member.offset_data, member.size)
                else:
                    raise CheckpointError(f"{member.name!r} is not a file")
    except (tarfile.TarError, OSError) as exc:
        raise CheckpointError(f"the checkpoint image is corrupt: {exc}") from exc


def _inside(name: str) -> tuple[str, ...]:
    parts = tuple(part for part in PurePosixPath(name).parts if part != ".")
    if not parts or PurePosixPath(name).is_absolute() or ".." in parts:
        raise CheckpointError(f"the checkpoint image is corrupt: {name!r} is outside it")
    return parts


def _copy_range(source: int, target: Path, offset: int, size: int) -> None:
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        done = 0
        while done < size:
            moved = os.copy_file_range(source, fd, size - done, offset + done)
            if not moved:
                raise CheckpointError("the checkpoint image is corrupt: it ends early")
            done += moved
    finally:
        os.close(fd)


def first_records(image: Path) -> dict[str, Any] | None:
    """The records of a packed dump, read from the head of its archive, where
    :class:`Packing` puts them; None when they are not there (an archive of an earlier
    gateway, or not one at all: the unpacking says so)."""
    if image.name.endswith(STORED_SUFFIX):
        try:
            with tarfile.open(image, mode="r:") as archive:
                return _records(archive)
        except (tarfile.TarError, ValueError, OSError):
            return None
    program = (ZSTD or "zstd") if image.name.endswith(".zst") else "gzip"
    fd = os.open(image, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        with subprocess.Popen([program, "-dc"], stdin=fd, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL) as unpacker:
            assert unpacker.stdout is not None
            try:
                with tarfile.open(fileobj=unpacker.stdout, mode="r|") as archive:
                    return _records(archive)
            except (tarfile.TarError, ValueError, OSError):
                return None
            finally:
                unpacker.kill()
    finally:
        os.close(fd)


def _records(archive: tarfile.TarFile) -> dict[str, Any] | None:
    """The records, if the archive's first member is them."""
    member = archive.next()
    if member is None or member.name.lstrip("./") != ABOUT_NAME \
            or not member.isfile() or member.size > 1 << 16:
        return None
    read = archive.extractfile(member)
    about = json.loads(read.read()) if read is not None else None
    return about if isinstance(about, dict) else None
