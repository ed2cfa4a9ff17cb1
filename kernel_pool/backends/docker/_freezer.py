"""Stop every process of a container at once, from the host: its cgroup's freezer.

A fork bomb re-forks while it is killed one process at a time, and each kill frees a slot under
the pids limit for a new fork, so a reaper that lists and kills can lose the race (issue 30).
A frozen cgroup runs nothing: a fork under way ends with its child frozen as well, so the list
read then is complete and stays so while it is killed. The SIGKILLs sent meanwhile take effect at
the thaw (measured on Linux 6.18, cgroup v1: a killed frozen process stays listed until the thaw,
then exits within milliseconds); nothing of the container, its PID 1 and its kernel included,
runs in between, which lasts a few milliseconds.

The engine's ``docker pause`` freezes the same cgroup, but through runc (a process started per
call, 10-25 ms idle, more on a loaded host) and visibly: the container is "paused" to every
other engine client meanwhile, its ``docker exec`` (a shell command starting beside the kernel)
refused. Writing the freezer's file is a system call, and the hosts where it is not allowed
(no root) are those where the reaper's kills are not either.

cgroup v1 (the ``freezer`` controller, as the engine uses it on a v1 or hybrid host) or v2
(``cgroup.freeze``). A cgroup some other party froze (a ``docker pause``, a checkpoint) is left
as it is: its processes cannot fork, and only that party may thaw it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from pathlib import Path

from kernel_pool.backends.docker._cgroup import CGROUP_ROOT, read_pseudo_file

FREEZE_WAIT_S = 1.0
"""How long a freeze waits for every process to stop. One in an uninterruptible sleep (disk
I/O) stops only once it wakes; until then it cannot fork either, and what the reaper finds
meanwhile it kills on its next pass."""


class Freezer:
    """The freezer of one container's cgroup."""

    def __init__(self, folder: Path, unified: bool) -> None:
        self.folder = folder
        self.unified = unified
        self._state = str(folder / ("cgroup.freeze" if unified else "freezer.state"))
        self._events = str(folder / "cgroup.events")

    def __repr__(self) -> str:
        return f"<Freezer {'v2' if self.unified else 'v1'} {self.folder}>"

    @classmethod
    def for_pid(cls, pid: int, container_id: str) -> Freezer | None:
        """The freezer of host process ``pid``'s cgroup (the container's PID 1); None where
        the host has none that can be written (not root, a remote engine), or where ``pid``'s
        cgroup is not ``container_id``'s (the pid came from an earlier look at the engine and
        may be another process's by now: its cgroup is never frozen or thawed)."""
        try:
            text = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return None
        if container_id not in text:
            return None
        paths = {}
        for line in text.splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller] = path.lstrip("/")
        # On a hybrid host the engine freezes through v1: the same file tells its freezes.
        candidates = []
        if "freezer" in paths:
            candidates.append(cls(CGROUP_ROOT / "freezer" / paths["freezer"], False))
        if "" in paths:
            candidates += [cls(CGROUP_ROOT / "unified" / paths[""], True),
                           cls(CGROUP_ROOT / paths[""], True)]
        for freezer in candidates:
            if os.access(freezer._state, os.W_OK):
                return freezer
        return None

    def _frozen(self) -> bool | None:
        """True frozen, False thawed, None on the way (v1's FREEZING; v2's asked but not yet)."""
        if self.unified:
            asked = read_pseudo_file(self._state).strip() == b"1"
            done = b"frozen 1" in read_pseudo_file(self._events).splitlines()
            if asked:
                return True if done else None
            return None if done else False
        state = read_pseudo_file(self._state).strip()
        return True if state == b"FROZEN" else False if state == b"THAWED" else None

    def _write(self, frozen: bool) -> None:
        value = (b"1" if frozen else b"0") if self.unified else (
            b"FROZEN" if frozen else b"THAWED")
        fd = os.open(self._state, os.O_WRONLY)
        try:
            os.write(fd, value)
        finally:
            os.close(fd)

    def freeze(self) -> bool | None:
        """Freeze the cgroup and wait until every process in it has stopped (at most
        :data:`FREEZE_WAIT_S`): True when this call froze it (:meth:`thaw` must follow); None
        when someone else's freeze holds it (left untouched); False when it cannot be frozen."""
        try:
            if self._frozen() is not False:
                return None
            self._write(True)
        except OSError:
            return False
        deadline = time.monotonic() + FREEZE_WAIT_S
        try:
            for attempt in itertools.count(1):
                if self._frozen():
                    break
                if time.monotonic() >= deadline:
                    break  # stuck in a sleep that cannot freeze: it cannot fork either
                if attempt % 20 == 0:
                    self._write(True)  # asks every process again, as runc does (older kernels)
                time.sleep(0.0005)
        except OSError:
            pass  # the container is going away; the thaw says so too
        return True

    def freeze_nowait(self) -> bool:
        """Ask the cgroup to freeze and return at once (one write; its processes stop within
        milliseconds): whether this call froze it (:meth:`thaw` must follow). A warm kernel
        waits so, costing no CPU; nothing waits for the freeze to end, since nothing needs
        it to have ended."""
        try:
            if self._frozen() is not False:
                return False
            self._write(True)
        except OSError:
            return False
        return True

    def thaw(self) -> None:
        """End :meth:`freeze`'s freeze (nothing when the cgroup is gone)."""
        with contextlib.suppress(OSError):
            self._write(False)
