"""A memory image's archive: a dump's folder packed into one 0600 file (``tar``, compressed with
``zstd -1`` where the host has it, else ``gzip -1``), its records (``replgate.json``) first so that
a restore reads them before the rest, and unpacked again. Packing runs after the pause has
answered and may be cancelled; a stop signal to the gateway does not cut it short.
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
from pathlib import Path
from typing import Any

ABOUT_NAME = "replgate.json"
ZSTD = shutil.which("zstd")
COMPRESSOR = [ZSTD, "-1", "-q", "-T0"] if ZSTD else ["gzip", "-1"]
"""zstd -1 packed a 93 MB checkpoint of a kernel to 23 MB in 0.30 s on the development machine;
gzip -1 to 26 MB in 1.5 s (docs/checkpoint.md)."""
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
"""What stops a gateway, and must not stop its packing (see :class:`Packing`)."""
IMAGE_SUFFIXES = (".tar.zst", ".tar.gz")
"""The names a checkpoint archive may have (after the session's id), the one made here first."""
IMAGE_SUFFIX = IMAGE_SUFFIXES[0] if ZSTD else IMAGE_SUFFIXES[1]


class CheckpointError(Exception):
    """A dump, a packing or a restore failed; the message says which, with the engine's words."""


class Packing:
    """The packing of :func:`dump`'s folder into one 0600 archive, ``stem`` + the archive's
    suffix; :meth:`cancel` (from any thread) stops it, its partial file removed. The folder
    is left to the caller either way."""

    def __init__(self, folder: Path, stem: Path) -> None:
        self.folder = folder
        self.image = stem.with_name(stem.name + IMAGE_SUFFIX)
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
                    tar = subprocess.Popen(["tar", "-C", str(self.folder), "-cf", "-",
                                            "--", *self._names()],
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           start_new_session=True)
                    assert tar.stdout is not None
                    packer = subprocess.Popen(COMPRESSOR, stdin=tar.stdout, stdout=fd,
                                              stderr=subprocess.PIPE, start_new_session=True)
                finally:
                    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
                self._processes = [tar, packer]
            tar.stdout.close()
            _, packer_err = packer.communicate()
            _, tar_err = tar.communicate()
            if self._cancelled:
                raise CheckpointError("the packing was cancelled")
            if tar.returncode or packer.returncode:
                said = (tar_err or packer_err).decode(errors="replace").strip()[-300:]
                raise CheckpointError(f"packing failed (tar: {tar.returncode}, "
                                      f"{Path(COMPRESSOR[0] or '').name}: {packer.returncode})"
                                      f"{': ' + said if said else ''}")
            os.fsync(fd)
        except BaseException:
            os.unlink(partial)
            raise
        finally:
            os.close(fd)
        os.replace(partial, self.image)
        return self.image



def unpack(image: Path, folder: Path) -> None:
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



def first_records(image: Path) -> dict[str, Any] | None:
    """The records of a packed dump, read from the head of its archive, where
    :class:`Packing` puts them; None when they are not there (an archive of an earlier
    gateway, or not one at all: the unpacking says so)."""
    program = (ZSTD or "zstd") if image.name.endswith(".zst") else "gzip"
    fd = os.open(image, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        with subprocess.Popen([program, "-dc"], stdin=fd, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL) as unpacker:
            assert unpacker.stdout is not None
            try:
                with tarfile.open(fileobj=unpacker.stdout, mode="r|") as archive:
                    member = archive.next()
                    if member is None or member.name.lstrip("./") != ABOUT_NAME \
                            or not member.isfile() or member.size > 1 << 16:
                        return None
                    read = archive.extractfile(member)
                    about = json.loads(read.read()) if read is not None else None
            except (tarfile.TarError, ValueError, OSError):
                return None
            finally:
                unpacker.kill()
    finally:
        os.close(fd)
    return about if isinstance(about, dict) else None
