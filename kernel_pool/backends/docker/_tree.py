"""Memory pauses by a kernel-tree dump: CRIU, entered into the sandbox's container as for
kernel templates (:mod:`._template`), dumps the kernel's process tree alone, and on resume
restores it into the same container, started again by the engine with a plain ``start``.

The engine's own restore (``start --checkpoint``) copies the whole image twice through
containerd before CRIU reads it: 1.8-2.1 s for a kernel with the data stack, where CRIU's
restore is 0.3-0.6 s of it (docs/checkpoint.md). Here the container starts as any stopped
container does (0.2 s) and CRIU restores the kernel into it, in its cgroups, as its PID 1's
child (adopted as a template's kernel is). The container stays the engine's throughout.

What the tree dump holds, and what it does not:

- the kernel and its descendants: memory, threads, open files and their positions, pipes,
  sockets between them, credentials, seccomp filter, rlimits (CRIU's images);
- the container's ``/tmp`` and ``/dev/shm`` (tmpfs mounts, empty again when the container
  starts) are not in CRIU's images of a tree: they are saved beside them, by ``tar`` run in
  the container's mount namespace as the sandbox's user, while the dumped tree is still
  stopped (nothing changes them meanwhile), and put back before the restore (CRIU reopens
  the files by path, and checks their sizes);
- a process outside the kernel's tree (an orphan re-parented to PID 1, say) is not held:
  :func:`outside_the_tree` finds them first, and the caller then dumps the whole container;
- System V IPC objects (shared memory segments, semaphores, message queues) belong to the
  container's IPC namespace, not to the tree, and would be gone after the restore:
  :func:`sysv_objects` finds them first, and the caller then dumps the whole container (whose
  dump holds its IPC namespace).

Every call here blocks: callers use worker threads.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

from kernel_pool._disk import SANDBOX_GID, SANDBOX_UID
from kernel_pool.backends.docker._checkpoint import TREE_KEY, WORK_NAME, without_host_paths
from kernel_pool.backends.docker._packing import ABOUT_NAME
from kernel_pool.backends.docker._strays import find_strays
from kernel_pool.backends.docker._template import (
    TIME_NAMESPACE,
    TemplateError,
    entered,
    first_pid,
    run_criu,
)

FILES_NAME = "files.tar"
"""The container's ``/tmp`` and ``/dev/shm``, beside CRIU's images."""
SAVED_FOLDERS = ("tmp", "dev/shm")
"""The container's tmpfs mounts the sandbox's user may write (relative to its root)."""
FILES_TIMEOUT_S = 120
CRIU_PID_HEADROOM = 4096
"""How far below the pid namespace's highest pid CRIU's own processes start on a restore,
so that every pid of the dumped tree (a booted kernel has pid 7 and its threads next) is
free for it."""


def outside_the_tree(procs_file: Path, init_pid: int, kernel_pid: int) -> int:
    """How many processes of the container are neither its PID 1 nor the kernel's tree
    (host pids): a tree dump would not hold them."""
    return len(find_strays(procs_file, init_pid, kernel_pid, keep_kernel_children=True))


def sysv_objects(init_pid: int) -> int:
    """How many System V IPC objects the container whose PID 1 has host pid ``init_pid``
    holds (``/proc/sysvipc`` shows the reader's IPC namespace: read from inside it)."""
    listed = subprocess.run(
        ["nsenter", f"--target={init_pid}", "--ipc", "--", "cat", "/proc/sysvipc/shm",
         "/proc/sysvipc/sem", "/proc/sysvipc/msg"],
        capture_output=True, text=True, timeout=10, check=True).stdout
    # Each file is a header line, then one line per object.
    return sum(1 for line in listed.splitlines()
               if line.strip() and not line.lstrip().startswith("key"))


def dump(init_pid: int, container_id: str, procs_file: Path, kernel_pid: int, folder: Path,
         about: dict[str, Any]) -> None:
    """Dump the tree of the kernel whose pid in its container is ``kernel_pid`` into
    ``folder`` (made afresh), with the container's writable tmpfs folders and ``about``
    (with :data:`TREE_KEY` set) beside it; the tree is left stopped for the caller to end
    with the container. ``procs_file`` lists the container's processes (host pids).

    On failure (:class:`TemplateError`, OSError) the kernel runs on: CRIU thaws what it froze
    when its dump fails, and a tree stopped after its dump is continued. The folder is
    removed."""
    shutil.rmtree(folder, ignore_errors=True)
    work = folder.with_name(WORK_NAME)
    shutil.rmtree(work, ignore_errors=True)
    folder.mkdir(parents=True, mode=0o700)
    work.mkdir(mode=0o700)
    try:
        try:
            # Left stopped, not ended: the tmpfs files are saved while nothing can change them.
            run_criu(init_pid, container_id, ["dump", "-t", str(kernel_pid), "--leave-stopped"],
                     folder, work, "dump")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        try:
            save_files(init_pid, container_id, folder / FILES_NAME)
            # As for a template: the restored kernel stays in its container's time namespace
            # (a nested one could never be dumped again); its clocks jump forward as after a
            # suspend.
            (folder / TIME_NAMESPACE).unlink(missing_ok=True)
            # Written last: a folder with these records is a whole dump (``whole_dump``).
            (folder / ABOUT_NAME).write_text(json.dumps({**about, TREE_KEY: True}))
        except BaseException:
            resume_stopped(procs_file, init_pid)
            raise
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def resume_stopped(procs_file: Path, init_pid: int) -> None:
    """Continue the processes of the container a dump left stopped (one not kept)."""
    for pid in find_strays(procs_file, init_pid, 0, keep_kernel_children=False):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def restore(init_pid: int, container_id: str, folder: Path, work: Path) -> None:
    """Put the saved tmpfs files back into the (just started) container whose PID 1 is host
    pid ``init_pid``, then restore the kernel's tree from ``folder`` into its namespaces and
    cgroups (it becomes PID 1's child when CRIU exits). ``work`` (made afresh, removed after)
    holds CRIU's log. :class:`TemplateError` on failure."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    first_pid(init_pid, container_id, pid_max - CRIU_PID_HEADROOM)
    load_files(init_pid, container_id, folder / FILES_NAME)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, mode=0o700)
    try:
        run_criu(init_pid, container_id,
                 ["restore", "--restore-detached", "--manage-cgroups=ignore"],
                 folder, work, "restore", join_cgroups=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def save_files(init_pid: int, container_id: str, archive: Path) -> None:
    """``tar`` of the container's writable tmpfs folders into ``archive`` (0600), run in the
    container's mount namespace as the sandbox's user: it reads only what that user may, and
    no link in there reaches the host's files."""
    fd = os.open(archive, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        # What the folders hold, not the folders: the sandbox's user may not set their mode
        # back (tar would fail on it). pipefail: a folder find cannot read fails the save.
        listed = (f"cd / && find {' '.join(SAVED_FOLDERS)} -mindepth 1 -print0 | "
                  "tar --null --no-recursion --numeric-owner -T - -cf -")
        _in_container(init_pid, container_id, ["bash", "-o", "pipefail", "-c", listed],
                      stdin=subprocess.DEVNULL, stdout=fd, what="saving /tmp")
        os.fsync(fd)
    finally:
        os.close(fd)


def load_files(init_pid: int, container_id: str, archive: Path) -> None:
    """Unpack :func:`save_files`' archive into the container, as the sandbox's user."""
    fd = os.open(archive, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        _in_container(init_pid, container_id,
                      ["tar", "-C", "/", "--same-permissions", "-xf", "-"],
                      stdin=fd, stdout=subprocess.DEVNULL, what="restoring /tmp")
    finally:
        os.close(fd)


def _in_container(init_pid: int, container_id: str, command: list[str], *, stdin: Any,
                  stdout: Any, what: str) -> None:
    with entered(init_pid, container_id, ("mnt",)) as (options, fds, _):
        try:
            done = subprocess.run(
                ["nsenter", *options, f"--setuid={SANDBOX_UID}", f"--setgid={SANDBOX_GID}",
                 "--", *command],
                stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, pass_fds=fds,
                timeout=FILES_TIMEOUT_S, check=False, start_new_session=True)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise TemplateError(f"{what} failed: {exc}", template_at_fault=False) from exc
    if done.returncode:
        said = done.stderr.decode(errors="replace").strip()[-300:]
        raise TemplateError(without_host_paths(f"{what} failed (exit status "
                                               f"{done.returncode}): {said}"))
