"""Kernel templates: a kernel booted once, dumped with CRIU, and restored into each new
sandbox's container instead of booting there.

A kernel's boot is about a second of imports (ipykernel, numpy, pandas, matplotlib); a
restore of the same kernel, imports done, is 0.15-0.2 s. The template is a real sandbox's
kernel: booted in a container of the profile, answering (so its pre-imports are done), then
dumped, its process tree alone, by CRIU run *inside* that container's namespaces (``nsenter``
into its mount, pid, network, IPC and UTS namespaces). A new sandbox's container is made by
the engine as always, with its PID 1; CRIU, entered into that container's namespaces and
cgroups, restores the kernel there. The restored kernel keeps everything the container gave
the template's: uid 1000, no capabilities, no-new-privileges, the engine's seccomp filter,
rlimits; it is charged to its own container's cgroups, and when CRIU exits it is re-parented
to that container's PID 1, which adopts it (``replgate_kernel/init.py``). The container stays
the engine's: shell commands, the cgroup readings, a memory pause and the removal work as for
a booted kernel.

CRIU runs in the container's mount namespace, where the host's files are not: the private
CRIU root that ``./run.sh`` installs (``/opt/replgate/criu``, with its own loader and
libraries) is reached through file descriptors opened before entering (``/proc/self/fd/N``),
and so are the image and work folders. A host whose CRIU is its system's own has no such
root, and no templates. The template's processes take pids from :data:`TEMPLATE_PID` on, far
above those a new container's PID 1 and CRIU itself take, so each is free where it is
restored.

Every copy restored from one template starts with the same random generators' state and the
same connection key: the kernel is re-keyed and reseeded at once (:func:`rekey`, which runs
``replgate_kernel/restored.py``), before anyone else reaches it. Every call here but
:func:`rekey` blocks: callers use worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jupyter_client.asynchronous.client import AsyncKernelClient

from kernel_pool.backends.docker._cgroup import procs_files
from kernel_pool.backends.docker._checkpoint import criu_log_errors, without_host_paths
from kernel_pool.backends.docker._criu import CRIU_HOME, LIBRARIES, CheckpointSupport, criu_command
from kernel_pool.backends.docker._strays import pidfd_exited

if TYPE_CHECKING:
    from kernel_pool.backends.base import Sandbox

TEMPLATE_PID = 10000
"""The first pid of a template's kernel inside its container."""
RECORDS = "template.json"
FILES = "files.tar"
"""A template's ``/tmp`` and ``/dev/shm`` as its kernel's service left them (a profile with a
``start_cmd``: what the service wrote there as it started is in its sandboxes too)."""
TIME_NAMESPACE = "timens-0.img"
CRIU_TIMEOUT_S = 60
NSENTER_NAMES = {"mnt": "mount", "pid": "pid", "net": "net", "ipc": "ipc", "uts": "uts"}
"""``/proc/PID/ns`` names, and the ``nsenter`` options that take them as files."""


class TemplateError(Exception):
    """A template could not be made or restored; the message says why, with CRIU's words.
    ``template_at_fault``: whether the template itself is to blame (not, say, a CRIU killed
    by a stop signal, or a machine too busy to answer in time)."""

    def __init__(self, message: str, template_at_fault: bool = True) -> None:
        super().__init__(message)
        self.template_at_fault = template_at_fault


@dataclass(frozen=True)
class Template:
    """A dumped kernel, ready to restore: its folder of CRIU images and what it was."""

    folder: Path
    kernel_name: str
    kernel_pid: int
    """The kernel's pid inside its container, as restored."""
    key: str
    """The template's connection key (each restored copy is re-keyed at once)."""
    files: Path | None = None
    """Its container's ``/tmp`` and ``/dev/shm`` (:data:`FILES`), put back before a restore;
    None when only the kernel's own folders were there (made again after a restore)."""


def refusal(support: CheckpointSupport) -> str | None:
    """Why templates cannot be made on this host, as a sentence, given what
    :func:`~._criu.checkpoint_support` found; None when they can."""
    if not support.criu_works:
        return support.reason
    if os.geteuid() != 0:
        return "templates need the gateway to run as root (CRIU enters the containers)"
    if not (CRIU_HOME / "root/usr/sbin/criu").is_file() or not (
            CRIU_HOME / LIBRARIES / "ld-linux-x86-64.so.2").is_file():
        return (f"templates need the private CRIU root ./run.sh installs in {CRIU_HOME} "
                "(CRIU runs inside each container, where the host's libraries are not)")
    return None


def find(root: Path, stem: str) -> Template | None:
    """The newest whole template named ``stem-*`` in ``root`` (made by an earlier gateway, or
    another gateway sharing the folder), if any (see :func:`load`)."""
    name = re.compile(rf"{re.escape(stem)}-[0-9a-f]{{8}}")
    try:
        folders = [path for path in root.iterdir() if name.fullmatch(path.name)]
        folders.sort(key=lambda path: path.stat().st_mtime, reverse=True)
    except OSError:
        return None
    return next(filter(None, map(load, folders)), None)


def load(folder: Path) -> Template | None:
    """The template kept in ``folder``, if it is whole and was made since the host last
    started: its kernel's timers count on a monotonic clock that a restart of the host starts
    again from zero."""
    try:
        records = json.loads((folder / RECORDS).read_text())
        if not (folder / "inventory.img").is_file() or records.get("boot_id") != _boot_id():
            return None
        files = folder / FILES
        return Template(folder, str(records["kernel_name"]), int(records["kernel_pid"]),
                        str(records["key"]), files if files.is_file() else None)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def first_pid(init_pid: int, container_id: str, pid: int) -> None:
    """Make the next process of the container ``container_id``, whose PID 1 is host pid
    ``init_pid``, take ``pid`` (the kernel PID 1 starts next, for a template)."""
    # The pid namespace's counter is written from inside it (nsenter's child), through the
    # host's /proc: the container's own /proc/sys is read-only.
    with entered(init_pid, container_id, ("pid",)) as (options, fds, _):
        _run(["nsenter", *options, "--", "sh", "-c",
              f"echo {pid - 1} > /proc/sys/kernel/ns_last_pid"], "set the kernel's pid",
             pass_fds=fds)


def dump(init_pid: int, container_id: str, kernel_pid: int, root: Path, stem: str,
         kernel_name: str, key: str, keep_files: Callable[[Path], None] | None = None,
         ) -> Template:
    """Dump the kernel whose pid in its container is ``kernel_pid`` (it ends) into a new
    folder ``stem-<random>`` of ``root``; the template. Nothing may be connected to it.
    ``keep_files``, given, writes the container's tmpfs folders to the path it is given (once
    the tree has ended: nothing changes them then).

    A template's folder never changes once made: gateways sharing ``root`` may each hold it
    (with its key), and a new template of the same stem is a folder of its own."""
    if kernel_pid < TEMPLATE_PID:
        raise TemplateError(f"the template's kernel has pid {kernel_pid}, below {TEMPLATE_PID}")
    folder = root / f"{stem}-{secrets.token_hex(4)}"
    partial = folder.with_name(folder.name + ".part")
    partial.mkdir(parents=True, mode=0o700)
    work = partial / "work"
    work.mkdir()
    try:
        run_criu(init_pid, container_id, ["dump", "-t", str(kernel_pid)], partial, work, "dump")
    except TemplateError:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(work)
    if keep_files is not None:
        try:
            keep_files(partial / FILES)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    # Without the clocks' values, CRIU restores the kernel in its container's own time
    # namespace; with them it makes one of its own, and the container could then never be
    # checkpointed (CRIU: "Can't dump nested time namespace"). The template's clocks need
    # no keeping: a restored kernel sees them jump forward, as after a suspend.
    (partial / TIME_NAMESPACE).unlink(missing_ok=True)
    (partial / RECORDS).write_text(json.dumps(
        {"kernel_name": kernel_name, "kernel_pid": kernel_pid, "key": key,
         "boot_id": _boot_id()}))
    os.rename(partial, folder)
    return Template(folder, kernel_name, kernel_pid, key,
                    folder / FILES if keep_files is not None else None)


def remove_others(root: Path, profile: str, keep: Path) -> None:
    """Remove ``profile``'s templates in ``root`` but ``keep`` (older ones, another image's,
    unfinished ones): for a folder no other gateway shares."""
    name = re.compile(rf"{re.escape(profile)}-[0-9a-f]{{16}}-[0-9a-f]{{8}}(?:\.part)?")
    for folder in root.iterdir():
        if folder != keep and name.fullmatch(folder.name):
            shutil.rmtree(folder, ignore_errors=True)


def remove_stale_parts(root: Path) -> None:
    """Remove the unfinished dumps a gateway killed while making a template left in
    ``root`` (one still being made, by a gateway sharing the folder, is younger)."""
    stale = time.time() - 2 * CRIU_TIMEOUT_S
    for partial in root.glob("*.part"):
        with contextlib.suppress(OSError):
            if partial.stat().st_mtime < stale:
                shutil.rmtree(partial, ignore_errors=True)


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def restore(template: Template, init_pid: int, container_id: str, work: Path) -> float:
    """Restore the template's kernel into the container ``container_id``, whose PID 1 is host
    pid ``init_pid``, into that container's cgroups, as PID 1's child; the seconds it took.
    ``work`` (made afresh, removed after) holds CRIU's log."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, mode=0o700)
    try:
        started = time.monotonic()
        run_criu(init_pid, container_id,
              ["restore", "--restore-detached", "--manage-cgroups=ignore"],
              template.folder, work, "restore", join_cgroups=True)
        return time.monotonic() - started
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _shell_client(connection: dict[str, Any]) -> AsyncKernelClient:
    """A client of the kernel's shell channel alone (nothing else is asked of it here)."""
    client = AsyncKernelClient()
    info: Any = connection  # jupyter_client types it as a TypedDict
    client.load_connection_info(info)
    client.start_channels(shell=True, iopub=False, stdin=False, hb=False, control=False)
    return client


async def answered(sandbox: Sandbox, connection: dict[str, Any], timeout_s: float) -> None:
    """Wait until ``sandbox``'s kernel (reached by ``connection``) answers a ``kernel_info``
    request (its imports are done by then: it imports before it serves). :class:`TemplateError`
    when it did not within ``timeout_s``, or as soon as the kernel exits first: a profile's
    service that fails ends the launcher at once, and waiting out the whole start timeout
    would hold the sandbox and its image that long."""
    asking = asyncio.ensure_future(_first_answer(connection, timeout_s))
    ending = asyncio.ensure_future(sandbox.wait())
    try:
        await asyncio.wait({asking, ending}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (asking, ending):
            task.cancel()
        await asyncio.gather(asking, ending, return_exceptions=True)
    if asking.done() and not asking.cancelled():
        asking.result()  # its TemplateError when it timed out
        return
    said = await sandbox.start_errors()
    raise TemplateError(f"the template's kernel exited with {ending.result()} before it "
                        "answered" + (f": {said}" if said else ""))


async def _first_answer(connection: dict[str, Any], timeout_s: float) -> None:
    """Ask for ``kernel_info`` until the kernel answers; TemplateError after ``timeout_s``."""
    client = _shell_client(connection)
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                msg_id = client.kernel_info()
                try:
                    # A request sent before the kernel bound its socket is lost: ask again.
                    async with asyncio.timeout(1.0):
                        while (await client.get_shell_msg())["parent_header"].get(
                                "msg_id") != msg_id:
                            pass
                    return
                except TimeoutError:
                    continue
    except TimeoutError as exc:
        raise TemplateError(f"the template's kernel did not answer in {timeout_s:g} s") from exc
    finally:
        client.stop_channels()


async def rekey(connection: dict[str, Any], old_key: str, timeout_s: float) -> None:
    """Have the kernel restored from a template (reached with ``old_key``, the template's)
    take ``connection``'s key, and reseed its random generators; its answer, signed with the
    new key, proves it did."""
    key = str(connection["key"])
    client = _shell_client({**connection, "key": old_key})
    try:
        msg_id = client.execute(
            f"__import__('replgate_kernel.restored').restored.after_restore({key!r})",
            silent=True, store_history=False)
        # The reply comes signed with the new key: checked with it, it proves the change.
        client.session.key = key.encode()
        async with asyncio.timeout(timeout_s):
            while True:
                reply = await client.get_shell_msg()
                if reply["parent_header"].get("msg_id") == msg_id:
                    break
    except (TimeoutError, ValueError) as exc:
        said = str(exc) or "no answer"
        raise TemplateError(f"the restored kernel did not take its new key ({said})") from exc
    finally:
        client.stop_channels()
    if reply["content"].get("status") != "ok":
        raise TemplateError("the restored kernel could not start afresh: "
                            f"{reply['content'].get('evalue', '')}"[:300])


@contextlib.contextmanager
def entered(init_pid: int, container_id: str, kinds: tuple[str, ...],
             ) -> Iterator[tuple[list[str], tuple[int, ...], str]]:
    """``nsenter``'s options for the namespaces ``kinds`` of the container's PID 1, opened
    as file descriptors (to pass on), and its ``/proc/PID/cgroup``; only once host pid
    ``init_pid`` is known to be that process, and to have stayed it while they were opened:
    a pid the host gave to another process meanwhile must never be entered."""
    try:
        pidfd = os.pidfd_open(init_pid)
    except OSError as exc:
        raise TemplateError("the container's PID 1 is gone", template_at_fault=False) from exc
    opened: list[int] = []
    try:
        try:
            text = Path(f"/proc/{init_pid}/cgroup").read_text()
            if container_id not in text:
                raise TemplateError("the container's PID 1 is gone", template_at_fault=False)
            for kind in kinds:
                opened.append(os.open(f"/proc/{init_pid}/ns/{kind}", os.O_RDONLY))
        except OSError as exc:
            raise TemplateError(f"the container's namespaces cannot be opened: {exc}",
                                template_at_fault=False) from exc
        if pidfd_exited(pidfd):
            raise TemplateError("the container's PID 1 is gone", template_at_fault=False)
        options = [f"--{NSENTER_NAMES[kind]}=/proc/self/fd/{fd}"
                   for kind, fd in zip(kinds, opened, strict=True)]
        yield options, tuple(opened), text
    finally:
        for fd in opened:
            os.close(fd)
        os.close(pidfd)


def run_criu(init_pid: int, container_id: str, arguments: list[str], images: Path, work: Path,
          log: str, join_cgroups: bool = False) -> None:
    """Run CRIU inside the namespaces (and, with ``join_cgroups``, the cgroups) of the
    container ``container_id``, whose PID 1 is host pid ``init_pid``."""
    with entered(init_pid, container_id, ("mnt", "pid", "net", "ipc", "uts")) as (
            options, namespaces, proc_cgroup):
        procs = procs_files(proc_cgroup) if join_cgroups else []
        if join_cgroups and len(procs) < len(proc_cgroup.splitlines()):
            raise TemplateError("the container's cgroups were not all found under "
                                "/sys/fs/cgroup")
        opened = [os.open(path, os.O_RDONLY | os.O_DIRECTORY)
                  for path in (CRIU_HOME, images, work)]
        home, images_fd, work_fd = (f"/proc/self/fd/{fd}" for fd in opened)
        command = ["nsenter", *options, "--", *criu_command(home), *arguments,
                   "-D", images_fd, "-W", work_fd, "-o", f"{log}.log"]
        if join_cgroups:
            # The shell joins the container's cgroups, then becomes nsenter, whose child
            # (CRIU) and the processes it restores are born there: charged to its limits.
            join = ('for f in "$@"; do [ "$f" = -- ] && break; echo $$ > "$f"; shift; done; '
                    'shift; exec "$@"')
            command = ["sh", "-c", join, "sh", *map(str, procs), "--", *command]
        try:
            _run(command, f"CRIU's {log}", pass_fds=(*namespaces, *opened),
                 log=work / f"{log}.log")
        finally:
            for fd in opened:
                os.close(fd)


def _run(command: list[str], what: str, pass_fds: tuple[int, ...] = (),
         log: Path | None = None) -> None:
    try:
        # A session of its own: a stop signal to the gateway's process group must not cut a
        # dump or restore short (it takes a fraction of a second; the stop waits for it).
        done = subprocess.run(command, capture_output=True, pass_fds=pass_fds,
                              timeout=CRIU_TIMEOUT_S, check=False, start_new_session=True)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TemplateError(f"{what} failed: {exc}", template_at_fault=False) from exc
    if done.returncode < 0:  # killed (a stop of the gateway): no fault of the template's
        raise TemplateError(f"{what} was stopped by signal {-done.returncode}",
                            template_at_fault=False)
    if done.returncode:
        said = done.stderr.decode(errors="replace").strip()[-300:]
        errors = criu_log_errors(log) if log is not None else ""
        raise TemplateError(without_host_paths(
            f"{what} failed (exit status {done.returncode}){': ' + said if said else ''}"
            f"{errors}"))
