"""A Docker sandbox's memory image: checkpoint (a memory pause), pack, restore (resume)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import docker
import docker.errors

from kernel_pool._languages import KERNEL_LANGUAGES
from kernel_pool.backends.docker._boot_id import write_boot_id
from kernel_pool.backends.docker._checkpoint import (
    TREE_KEY,
    checkpoint_dir,
    checkpoint_failure,
    discard,
    dump,
    folder_bytes,
    loopback_settled,
    whole_dump,
)
from kernel_pool.backends.docker._checkpoint import restore as restore_checkpoint
from kernel_pool.backends.docker._docker import (
    KERNEL_DIR,
    call_engine,
    in_thread,
    kernel_connection,
    read_connection_file,
)
from kernel_pool.backends.docker._init_kernel import (
    CONTEXT_KERNEL_NAME,
    KERNEL_NAME,
    container_pid,
    host_pid,
    request_adoption,
    write_for_sandbox,
)
from kernel_pool.backends.docker._loopback import bring_loopback_up
from kernel_pool.backends.docker._packing import CheckpointError, Packing
from kernel_pool.backends.docker._sandbox_base import DockerSandboxBase
from kernel_pool.backends.docker._template import TemplateError
from kernel_pool.backends.docker._tree import dump as dump_tree
from kernel_pool.backends.docker._tree import outside_the_tree, resume_stopped, sysv_objects
from kernel_pool.backends.docker._tree import restore as restore_tree
from kernel_pool.exceptions import BackendError

logger = logging.getLogger(__name__)

TREE_STOP_TIMEOUT_S = 30
"""A container killed after its kernel's tree was dumped ends at once; the wait is bounded."""
# The engine's kill of a dumped tree's container (its memory freed, containerd's exit handled)
# took 0.75 s of a 1 GiB memory pause's 2.2 s (0.2-0.3 s for an idle kernel's): it is done
# after the pause answers, as the sandbox is released (``end_dumped_tree``), and every later
# use of the sandbox waits for that release (``Kernel.settle``).
RELAY_SETTLE_S = 1.0
"""How long Deno's relay may take to close its connections to the kernel before a dump."""


class SandboxCheckpoints(DockerSandboxBase):
    """A sandbox's memory pause and resume: the kernel's tree dumped inside its container,
    or the whole container by the engine (see :mod:`._checkpoint`, :mod:`._tree`)."""

    def _context_records(self) -> list[dict[str, Any]]:
        """The running contexts' kernels, for a checkpoint's records: each one's context
        name, kernel name, language, pid inside the container and connection key."""
        records = []
        for name, face in self._context_faces.items():
            kernel_name, pid = face.info.kernel_name, face.pid
            inside = container_pid(pid) if pid else None
            if kernel_name and inside is not None:
                records.append({"name": name, "kernel_name": kernel_name, "pid": inside,
                                "key": face.key, "language": face.language})
        return records

    async def checkpoint(self) -> Path:
        """runc's checkpoint of the container (CRIU on the engine's host), in the folder the
        engine restores from (see :mod:`._checkpoint`)."""
        name = self.info.kernel_name
        if not self._through_init or not name or not self._pid:
            raise BackendError("only a running kernel of a runc sandbox can be checkpointed")
        about = await in_thread(self._kernel_records, name)
        # A relay closes its loopback connections to the kernel once the host's are gone (the
        # caller dropped them); CRIU refuses those still open or closing.
        relayed = any(KERNEL_LANGUAGES[record["language"]].relayed
                      for record in about["contexts"])
        if relayed and not await in_thread(loopback_settled, self._init_pid, RELAY_SETTLE_S):
            logger.info("sandbox %s: a TCP connection is still open after %g s; CRIU "
                        "may refuse the dump", self.info.sandbox_id, RELAY_SETTLE_S)
        folder = await self._checkpoint_tree(about) if self._backend.tree_checkpoints else None
        if folder is None:
            try:
                folder = await call_engine(dump, self._api, self.info.container_id,
                                           self._checkpoint_dir, about)
            except (CheckpointError, OSError) as exc:
                raise checkpoint_failure(exc) from exc
            self.memory_path = "engine"
        self._close_pidfd()
        self._pid, self._cgroup, self.info.kernel_ref = None, None, None
        return folder

    async def _checkpoint_tree(self, about: dict[str, Any]) -> Path | None:
        """The kernel's tree dumped from inside the container, which is then stopped (see
        :mod:`._tree`); None, the kernel running on, where it cannot hold everything or
        fails (the caller then dumps the whole container)."""
        procs = self._cgroup.procs_file if self._cgroup is not None else None
        if procs is None or not self._pid:
            return None
        outside = await in_thread(outside_the_tree, procs, self._init_pid, self._pid)
        if outside:
            logger.info("sandbox %s: %d processes outside the kernel's tree; the whole "
                        "container is dumped", self.info.sandbox_id, outside)
            return None
        try:
            shared = await in_thread(sysv_objects, self._init_pid)
        except (OSError, subprocess.SubprocessError) as exc:
            logger.warning("sandbox %s: its System V IPC objects could not be listed (%s); "
                           "the whole container is dumped", self.info.sandbox_id, exc)
            return None
        if shared:
            logger.info("sandbox %s: %d System V IPC objects, which a tree dump does not "
                        "hold; the whole container is dumped", self.info.sandbox_id, shared)
            return None
        started = time.monotonic()
        try:
            await in_thread(self._dump_tree, procs, about)
        except (TemplateError, CheckpointError, OSError, docker.errors.APIError) as exc:
            logger.warning("sandbox %s: the kernel-tree dump failed (%s); the engine's runc "
                           "dumps the whole container instead", self.info.sandbox_id,
                           checkpoint_failure(exc))
            return None
        logger.info("sandbox %s: memory pause by a kernel-tree dump in %.3f s",
                    self.info.sandbox_id, time.monotonic() - started)
        self.memory_path = "kernel tree"
        return self._checkpoint_dir

    def _dump_tree(self, procs: Path, about: dict[str, Any]) -> None:
        dump_tree(self._init_pid, self.info.container_id, procs, int(about["kernel_pid"]),
                  self._checkpoint_dir, about)
        # Looked at again now that the tree is stopped: a process that left it since the first
        # look (an orphan re-parented to PID 1) is in no image and would die with the container.
        if self._pid and outside_the_tree(procs, self._init_pid, self._pid):
            discard(self._checkpoint_dir)
            resume_stopped(procs, self._init_pid)
            raise CheckpointError("a process left the kernel's tree while it was dumped")
        # The tree is stopped, its image whole: the container ends as after runc's dump,
        # once the pause has answered (``end_dumped_tree``).
        self._tree_dumped = True

    async def end_dumped_tree(self) -> None:
        """End the container whose kernel's tree a memory pause dumped and left stopped (a
        no-op otherwise). A failure is logged, not raised: the image is whole, and the
        restore ends a container it finds running first (:meth:`_TreeRestore.start`)."""
        if self._tree_dumped:
            self._tree_dumped = False
            await in_thread(self._end_container, "a kernel-tree dump")

    def _end_container(self, after: str) -> None:
        """Kill the container and wait for its end (blocking); failures logged."""
        try:
            self._api.kill(self.info.container_id)
            self._api.wait(self.info.container_id, timeout=TREE_STOP_TIMEOUT_S)
        except docker.errors.NotFound:
            return
        except (OSError, docker.errors.APIError) as exc:
            logger.warning("sandbox %s: the engine did not confirm the container's end after "
                           "%s (%s)", self.info.sandbox_id, after, exc)

    def _restore_tree(self) -> None:
        """Restore the kernel's tree into the started container (blocking)."""
        started = time.monotonic()
        init_pid = int(self._api.inspect_container(self.info.container_id)["State"]["Pid"])
        work = self._backend.template_work / self.info.sandbox_id
        if self.boot_id is not None:
            self._show_boot_id(init_pid)
        try:
            restore_tree(init_pid, self.info.container_id, self._checkpoint_dir, work)
        except TemplateError as exc:
            raise CheckpointError(f"the kernel's tree could not be restored: {exc}") from exc
        logger.info("sandbox %s: kernel tree restored inside its container in %.3f s",
                    self.info.sandbox_id, time.monotonic() - started)

    @property
    def _checkpoint_dir(self) -> Path:
        return checkpoint_dir(self._backend.data_root, self.info.container_id)

    async def checkpoint_bytes(self, dump: Path) -> int:
        try:
            return await in_thread(folder_bytes, dump)
        except OSError as exc:
            raise checkpoint_failure(exc) from exc

    async def pack_checkpoint(self, dump: Path, stem: Path) -> Path:
        packing = Packing(dump, stem)
        work = asyncio.ensure_future(in_thread(packing.run))
        try:
            image = await asyncio.shield(work)
        except asyncio.CancelledError:
            # The thread's tar and zstd are killed, so the wait for it is short.
            packing.cancel()
            await asyncio.wait([work])
            if not work.cancelled():
                work.exception()
            raise
        except (CheckpointError, OSError) as exc:
            raise checkpoint_failure(exc) from exc
        try:
            await in_thread(discard, dump)
        except asyncio.CancelledError:
            # Too late to stop: the archive is whole and the dump gone (``in_thread`` waits
            # for the discard). Cancelled now, the caller would keep the dump's path and a
            # resume would restore from a folder that no longer exists, losing the image.
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        return image

    async def discard_checkpoint(self, dump: Path) -> None:
        await in_thread(discard, dump)

    async def left_checkpoint(self) -> Path | None:
        return await in_thread(whole_dump, self._checkpoint_dir)

    def _kernel_records(self, name: str) -> dict[str, Any]:
        # From the host's process table, not the sandbox's own record of it.
        pid = container_pid(self._pid) if self._pid else None
        try:
            key = read_connection_file(self._socket_dir / f"{name}.json")["key"]
        except (OSError, ValueError) as exc:
            raise BackendError(f"the kernel's connection file cannot be read: {exc}") from exc
        if pid is None:
            raise BackendError("the kernel process is gone")
        return {"kernel_name": name, "kernel_pid": pid, "key": key,
                "contexts": self._context_records()}

    async def restore(self, image: Path) -> dict[str, Any]:
        # Before the start: the engine's restore mounts the file (its bind over /proc, which
        # the image holds, with it); a tree's restore binds it in the started container.
        self.boot_id = self._next_boot()
        if self.boot_id is not None:
            await in_thread(write_boot_id, self._socket_dir, self.boot_id)
        try:
            about = await call_engine(restore_checkpoint, self._api, self.info.container_id,
                                      self._checkpoint_dir, image, _TreeRestore(self))
        except (CheckpointError, OSError, docker.errors.APIError) as exc:
            raise checkpoint_failure(exc) from exc
        tree = about.get(TREE_KEY) is True
        name, pid, key = about.get("kernel_name"), about.get("kernel_pid"), about.get("key")
        if (not isinstance(name, str) or not KERNEL_NAME.fullmatch(name)
                or not isinstance(pid, int) or not isinstance(key, str) or not key.isalnum()):
            raise BackendError("the checkpoint's records are malformed")
        config = kernel_connection(key)
        # The socket folder may have been made afresh while the sandbox was stopped: its
        # records go back, for a later gateway that takes the sandbox back (``load``).
        await in_thread(self._write_records, name, pid,
                        {**config, "ip": f"{KERNEL_DIR}/{name}"})
        self.info.kernel_name, self._exit_code = name, None
        await self._find_init()
        if tree:
            # CRIU, the restored tree's parent, has exited: PID 1 is its parent now, and must
            # know it as its kernel to record its exit.
            await in_thread(request_adoption, self._socket_dir, name, pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._init_pid, signal.SIGUSR1)
        else:
            await in_thread(bring_loopback_up, self._init_pid, self.info.container_id)
        await self._watch_init_child(name, 2.0)
        if self.info.kernel_ref is None:
            raise BackendError("the sandbox was restored without its kernel process")
        self._restored_contexts = await in_thread(self._find_restored_contexts,
                                                  about.get("contexts"))
        self.memory_path = "kernel tree" if tree else "engine"
        return {**config, "ip": str(self._socket_dir / name)}

    def _find_restored_contexts(self, records: Any) -> dict[str, tuple[str, int, dict[str, Any]]]:
        """The contexts' kernels a restored image held and that run (blocking): their
        records written back to the socket folder, their host pids found."""
        found: dict[str, tuple[str, int, dict[str, Any]]] = {}
        for record in records if isinstance(records, list) else []:
            name, kernel_name = record.get("name"), record.get("kernel_name")
            pid, key = record.get("pid"), record.get("key")
            if (not isinstance(name, str) or not isinstance(kernel_name, str)
                    or not CONTEXT_KERNEL_NAME.fullmatch(kernel_name)
                    or not kernel_name.startswith(name) or not isinstance(pid, int)
                    or not isinstance(key, str) or not key.isalnum()):
                logger.warning("sandbox %s: a code context's records in its memory image are "
                               "malformed; it starts afresh", self.info.sandbox_id)
                continue
            host = host_pid(self._init_pid, pid)
            if host is None:
                continue
            config = kernel_connection(key)
            self._write_records(kernel_name, pid, {**config, "ip": f"{KERNEL_DIR}/{kernel_name}"})
            found[name] = (kernel_name, host, {**config, "ip": str(self._socket_dir / kernel_name)})
        return found

    def _write_records(self, name: str, pid: int, config: dict[str, Any]) -> None:
        write_for_sandbox(self._socket_dir / f"{name}.json", json.dumps(config))
        write_for_sandbox(self._socket_dir / f"{name}.pid", str(pid))


class _TreeRestore:
    """A sandbox's kernel-tree restore, as :func:`._checkpoint.restore` drives it."""

    def __init__(self, sandbox: SandboxCheckpoints) -> None:
        self._sandbox = sandbox

    def start(self) -> None:
        sandbox = self._sandbox
        state = sandbox._api.inspect_container(sandbox.info.container_id)["State"]
        if state.get("Running"):
            # A dumped tree's container a stopped gateway never ended (its end comes after
            # the pause's answer): its stopped kernel holds the pids the restore needs.
            sandbox._end_container("a kernel-tree dump, found running at a restore")
        sandbox._api.start(sandbox.info.container_id)

    def restore(self, about: dict[str, Any]) -> None:
        self._sandbox._restore_tree()
