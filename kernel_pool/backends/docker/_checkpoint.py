"""Whole-container checkpoints of Docker's containers, kept as one compressed archive in the
gateway's state directory, restored through Docker's (experimental) checkpoint API.

The dump runs the engine's own runc directly, with the very command containerd runs for
``docker checkpoint create`` (``runc checkpoint --image-path IMG --work-path W <id>``, on the
engine's runc state): 0.3-0.45 s for a kernel with the data stack, where Docker's API took
2.0-2.9 s, most of it copying the images through containerd's content store into its data
root (docs/checkpoint.md). The
container's processes end as they do under Docker's checkpoint (the engine records it as
exited, 137), and the container stays Docker's. Where runc's state of the container is not
found (an engine with another exec root or runtime), Docker's API makes the dump instead.

Either way the images land where Docker 20.10 reads a checkpoint on start,
``<root>/containers/<id>/checkpoints/<name>`` (it refuses another folder: ``custom
checkpointdir is not supported``). That folder is packed afterwards (:class:`Packing`, which
the caller may cancel: the pause has answered by then) into one archive (``tar``, compressed
with ``zstd -1`` where the host has it, else ``gzip -1``), written 0600 where the caller says;
a restore unpacks it back there, or finds the folder not packed yet, and starts the container
from it (``POST /containers/{id}/start?checkpoint=``). Every call here blocks (runc, the
engine's answer, the packing): callers run them in worker threads.

A dump of the kernel's process tree alone, made inside the container (:mod:`._tree`, the
memory pause's first choice), lies in the same folder and is packed the same way; its restore
starts the container plainly and restores the tree into it (:class:`TreeRestore`).

The records a restore needs beside CRIU's images (the kernel's name, its pid inside the
container, its connection key) travel in the archive as ``replgate.json``: the socket folder,
which held them, is the sandbox's and may be emptied while the session is paused.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import secrets
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Protocol

import docker

from kernel_pool.backends.docker._criu import ROOT_PATH
from kernel_pool.backends.docker._packing import (
    ABOUT_NAME,
    CheckpointError,
    first_records,
    unpack,
)
from kernel_pool.exceptions import BackendError

CHECKPOINT_NAME = "replgate"
TREE_KEY = "kernel_tree"
"""Set in a dump's records when it holds the kernel's process tree alone (:mod:`._tree`)."""
ENGINE_TIMEOUT_S = 300
"""A dump or restore writes or reads the whole memory of the sandbox: minutes at worst."""
RUNC_STATE_ROOTS = (Path("/run/docker/runtime-runc/moby"),
                    Path("/var/run/docker/runtime-runc/moby"))
"""Where Docker's containerd keeps runc's state of the engine's containers: ``<exec root>/
runtime-runc/<containerd namespace>`` with the engine's default exec root."""
ENGINE_LOG_ROOTS = (*RUNC_STATE_ROOTS,
                    *(root / "containerd/daemon/io.containerd.runtime.v2.task/moby"
                      for root in (Path("/run/docker"), Path("/var/run/docker"))))
"""Where the engine's CRIU logs of a container may be (``<root>/<container id>/...``): runc's
state, and containerd's task folder, whose ``work`` folder a checkpoint or restore uses."""
CONTAINERD_STAGING = Path("/tmp")
"""Where containerd (1.6, as Docker 20.10 runs it, with no ``XDG_RUNTIME_DIR``) unpacks a
checkpoint it restores from, as ``ctrd-checkpoint<random>``; it never removes that copy."""
CRIU_LOG_NOISE = ("tun.c", "RLIMIT_NOFILE for self")
"""Errors CRIU logs on every run on this kind of host and survives (no tun device; no
CAP_SYS_RESOURCE for its own rlimit): they say nothing about a failure."""
WORK_NAME = ".replgate-criu-work"
"""The folder beside the checkpoint where CRIU writes its log during a dump (then removed)."""
DISCARDED_PREFIX = "replgate-restored-"
"""A restored dump's folder, moved into the container's folder while it is removed."""


def checkpoint_dir(data_root: Path, container_id: str) -> Path:
    """Where the engine whose data root is ``data_root`` restores the container from."""
    return data_root / "containers" / container_id / "checkpoints" / CHECKPOINT_NAME


def _url(api: docker.APIClient, path: str) -> str:
    """The engine's address for ``path`` (docker-py has no method for checkpoints)."""
    return f"{api.base_url}/v{api.api_version}{path}"


def _engine(answer: Any, what: str, container_id: str) -> None:
    if answer.status_code >= 300:
        try:
            message = str(answer.json().get("message", answer.text))
        except ValueError:
            message = answer.text
        log = criu_log_named(message, container_id, ENGINE_LOG_ROOTS)
        raise CheckpointError(f"{what}: {without_host_paths(message.strip())[-600:]}"
                              f"{criu_log_errors(log) if log else ''}")


def criu_log_named(message: str, container_id: str, roots: tuple[Path, ...]) -> Path | None:
    """The CRIU log the engine's message names (runc says only "criu failed"; the log says
    why), when it lies in the engine's own state of that container (``<root>/<id>``, for one
    of ``roots``) once resolved; else None: its lines reach the tenant in the session's
    reason, so no other file a message might name is ever read."""
    found = re.search(r"(?:path=|log file:) (/\S+/(?:criu-)?(?:dump|restore)\.log)\b", message)
    if found is None:
        return None
    log = Path(os.path.realpath(found.group(1)))
    if any(log.is_relative_to(root / container_id) for root in roots):
        return log
    return None


def without_host_paths(text: str) -> str:
    """``text`` with each absolute path cut to its last part (``.../restore.log``): the
    engine's and CRIU's words reach the tenant, the host's folders must not."""
    return _HOST_PATH.sub(lambda found: ".../" + found.group(0).rsplit("/", 1)[1], text)


def checkpoint_failure(exc: Exception) -> BackendError:
    """A failed dump, pack or restore as the backend's error, in words a tenant may read
    (the session's ``reason``): an OSError's text names the host's files."""
    return BackendError(without_host_paths(str(exc)))


_HOST_PATH = re.compile(r"(?<![\w.])(?:/[^\s/:'\"(),]+){2,}")


def criu_log_errors(log_path: Path) -> str:
    """The first error of a CRIU log (the cause: later ones are its consequences, such as
    "Restoring FAILED") and its last two, host paths cut, as `` (CRIU: a | ... | b | c)``;
    "" when there are none (or no log)."""
    try:
        with open(log_path, "rb") as log:
            lines = log.read()[-(1 << 16):].decode(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [without_host_paths(line.strip()) for line in lines
              if "Error (" in line and not any(noise in line for noise in CRIU_LOG_NOISE)]
    if len(errors) > 3:
        errors = [errors[0], "...", *errors[-2:]]
    # Each error cut on its own: cutting the joined text would drop the first, the cause.
    return f" (CRIU: {' | '.join(error[:200] for error in errors)})" if errors else ""


def dump(api: docker.APIClient, container_id: str, folder: Path,
         about: dict[str, Any]) -> Path:
    """Checkpoint the container (it stops, its memory free) into ``folder``, where the engine
    restores from (:func:`checkpoint_dir`), with ``about`` beside CRIU's images; that folder,
    for :class:`Packing`.

    When the dump fails the container runs on (CRIU resumes what it froze), and when the
    records cannot be written beside it, the container is started again from it.
    """
    shutil.rmtree(folder, ignore_errors=True)  # a leftover of a pause that went wrong
    runc = _runc(container_id)
    if runc is not None:
        try:
            _runc_dump(runc, container_id, folder)
        except CheckpointError:
            shutil.rmtree(folder, ignore_errors=True)
            raise
    else:
        answer = api.post(_url(api, f"/containers/{container_id}/checkpoints"),
                          json={"CheckpointID": CHECKPOINT_NAME, "Exit": True},
                          timeout=ENGINE_TIMEOUT_S)
        _engine(answer, "the engine could not checkpoint the sandbox", container_id)
    try:
        (folder / ABOUT_NAME).write_text(json.dumps(about))
    except OSError as exc:
        try:
            _start(api, container_id)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        raise CheckpointError(f"the checkpoint could not be kept ({exc}); the kernel runs on") \
            from exc
    return folder


def folder_bytes(folder: Path) -> int:
    """What a dump's folder takes on disk (blocking)."""
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def discard(folder: Path) -> None:
    """Remove a dump's folder (blocking)."""
    shutil.rmtree(folder, ignore_errors=True)


def whole_dump(folder: Path) -> Path | None:
    """``folder`` if it holds a dump :func:`dump` finished (CRIU's inventory, and the
    records written after it), else None, and whatever lies there (a dump cut short, CRIU's
    work folder, a restored one a killed gateway left, :func:`discard_soon`) is removed
    (blocking)."""
    try:
        for aside in folder.parent.parent.glob(f"{DISCARDED_PREFIX}*"):
            shutil.rmtree(aside, ignore_errors=True)
        if (folder / ABOUT_NAME).is_file() and (folder / "inventory.img").is_file():
            return folder
    except OSError:  # the engine's folders are root's: nothing of ours can be there
        return None
    shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(folder.with_name(WORK_NAME), ignore_errors=True)
    return None


def _runc(container_id: str) -> list[str] | None:
    """runc's command line on the engine's state of the container, with the ``criu`` that
    :func:`._criu.checkpoint_support` checked; None where either is not found."""
    runc, criu = shutil.which("runc", path=ROOT_PATH), shutil.which("criu", path=ROOT_PATH)
    root = next((root for root in RUNC_STATE_ROOTS
                 if (root / container_id / "state.json").is_file()), None)
    if runc is None or criu is None or root is None:
        return None
    return [runc, "--root", str(root), "--criu", criu]


def _runc_dump(runc: list[str], container_id: str, folder: Path) -> None:
    """``runc checkpoint`` with the options containerd gives it for Docker's checkpoint (none
    beyond the folders: runc itself declares the bind mounts external and dumps the tmpfs
    mounts' contents)."""
    work = folder.with_name(WORK_NAME)
    shutil.rmtree(work, ignore_errors=True)
    folder.mkdir(parents=True, mode=0o700)
    work.mkdir(mode=0o700)
    try:
        done = subprocess.run(
            [*runc, "checkpoint", "--image-path", str(folder), "--work-path", str(work),
             container_id], capture_output=True, timeout=ENGINE_TIMEOUT_S)
        if done.returncode:
            said = without_host_paths(done.stderr.decode(errors="replace").strip())[-600:]
            raise CheckpointError(f"runc could not checkpoint the sandbox: {said}"
                                  f"{criu_log_errors(work / 'dump.log')}")
    except subprocess.TimeoutExpired as exc:
        raise CheckpointError(f"runc's checkpoint took over {ENGINE_TIMEOUT_S}s") from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)


class TreeRestore(Protocol):
    """How a dump of the kernel's tree alone (:mod:`._tree`) is restored: the container
    started as any stopped one, then the tree restored into it from the unpacked folder."""

    def start(self) -> None:
        """Start the container (blocking)."""

    def restore(self, about: dict[str, Any]) -> None:
        """Restore the tree into the started container (blocking)."""


def restore(api: docker.APIClient, container_id: str, folder: Path, image: Path,
            tree: TreeRestore) -> dict[str, Any]:
    """Unpack ``image`` into ``folder``, where the engine looks for it, and start the
    container from it; the records kept with it (``about`` of :func:`dump`). The image
    itself is left in place. A dump of the kernel's tree alone (its records say so) is
    restored through ``tree`` instead of the engine, its container started while the image
    is unpacked (the records come first in the archive, see :class:`Packing`).

    ``image`` may also be :func:`dump`'s folder itself, not packed yet (a resume that comes
    during the packing): the container starts from it at once. Either way that folder is
    removed.
    """
    unpacked = image == folder
    if not unpacked:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True, mode=0o700)
    records = b""
    try:
        early = None if unpacked else first_records(image)
        with concurrent.futures.ThreadPoolExecutor(1) as starter:
            started = (starter.submit(tree.start)
                       if early is not None and early.get(TREE_KEY) is True else None)
            try:
                if not unpacked:
                    unpack(image, folder)
            finally:
                if started is not None:
                    started.result()
        records = (folder / ABOUT_NAME).read_bytes()
        about = json.loads(records)
        if not isinstance(about, dict):
            raise CheckpointError("the checkpoint's records are malformed")
        if about.get(TREE_KEY) is True:
            if started is None:
                tree.start()
            tree.restore(about)
        else:
            _start(api, container_id)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"the checkpoint cannot be read: {exc}") from exc
    finally:
        discard_soon(folder)
        if records:
            remove_staged_copies(records)
    return about


def discard_soon(folder: Path) -> None:
    """Remove a restored dump's folder in a thread of its own: moved aside at once (the next
    dump or restore finds its place empty), removed after; a 1 GiB memory image's removal
    was 0.2 s of its resume. Not a daemon thread: a gateway's exit waits for it, and what a
    killed one leaves is removed with the container, or when a gateway takes the session
    back (:func:`whole_dump`)."""
    aside = folder.parent.parent / f"{DISCARDED_PREFIX}{secrets.token_hex(4)}"
    try:
        folder.rename(aside)
    except FileNotFoundError:
        return
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
        return
    threading.Thread(target=shutil.rmtree, args=(aside, True),
                     name=f"discard {aside.name}").start()


def remove_staged_copies(records: bytes | None = None) -> int:
    """Remove containerd's copies of restored checkpoints of ours; how many. With
    ``records``, the copy holding exactly those (a restore's own, at once); without, every
    copy of a replgate checkpoint older than any restore may take (left by earlier gateways).

    Each is a whole sandbox's memory left outside the state directory (root's only, but
    never deleted by containerd 1.6: 93 MB per resume of a kernel with the data stack).
    Blocking.
    """
    removed = 0
    stale_before = time.time() - ENGINE_TIMEOUT_S
    try:
        entries = list(os.scandir(CONTAINERD_STAGING))
    except OSError:
        return 0
    for entry in entries:
        if not entry.name.startswith("ctrd-checkpoint"):
            continue
        try:
            # containerd's own (root's, a real folder): never one planted in /tmp.
            made = entry.stat(follow_symlinks=False)
            if not entry.is_dir(follow_symlinks=False) or made.st_uid != 0:
                continue
            fd = os.open(Path(entry.path) / ABOUT_NAME, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                staged = f.read(1 << 16)
        except OSError:
            continue
        if staged == records if records is not None else made.st_mtime < stale_before:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += 1
    return removed


def _start(api: docker.APIClient, container_id: str) -> None:
    answer = api.post(_url(api, f"/containers/{container_id}/start"),
                      params={"checkpoint": CHECKPOINT_NAME}, timeout=ENGINE_TIMEOUT_S)
    _engine(answer, "the engine could not restore the sandbox", container_id)


_HELD_TCP_STATES = {"01", "08"}
"""ESTABLISHED and CLOSE_WAIT (``/proc/net/tcp``'s hex states): a connection a process holds
open, which CRIU dumps only with ``tcp-established``. Listeners, and the other end's
TIME_WAIT or FIN_WAIT once its process closed it, are no obstacle."""


def loopback_settled(init_pid: int, wait_s: float) -> bool:
    """Wait (blocking) up to ``wait_s`` until no TCP connection in the network namespace of
    ``init_pid`` (a container's PID 1) is held open; whether none is."""
    deadline = time.monotonic() + wait_s
    while True:
        held = False
        for table in ("tcp", "tcp6"):
            try:
                lines = Path(f"/proc/{init_pid}/net/{table}").read_text().splitlines()[1:]
            except OSError:
                continue
            held = held or any(len(fields) > 3 and fields[3] in _HELD_TCP_STATES
                               for fields in (line.split() for line in lines))
        if not held:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
