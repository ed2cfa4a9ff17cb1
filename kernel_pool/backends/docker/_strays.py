"""Processes an execution left behind in its sandbox, found and killed from the host.

A daemon (double fork, ``setsid``) is re-parented to the container's PID 1 and would outlive
the execution that made it. The host sees every process of the container in its cgroup, with
the real parent of each, and none of them can leave that cgroup; so after an execution the
gateway kills every process there that is not PID 1, the kernel, or (unless the execution was
cut short by a timeout or an interrupt) one of the kernel's own descendants.

The same kill, sparing only PID 1, is the hard stop of a restart: it needs no new process in
the container (a ``docker exec``), which a fork bomb at the pids limit leaves no room for.

Each kill goes through a pidfd opened after re-checking the process's start time, so a pid
reused in between is never hit. The files read are kernel pseudo-files (microseconds).
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Callable, Collection
from pathlib import Path

from kernel_pool.backends.docker._cgroup import read_pseudo_file
from kernel_pool.backends.docker._freezer import Freezer

KILL_WITHIN_S = 5.0
"""How long the passes of a kill may go on. Under the freezer one pass finds everything (a
second, nothing). Without it, a bomb caught while it grows refills the slots each pass frees
with children of those it missed; a fixed number of passes (there were five) lost that race
in CI, so the passes go on until one finds nothing, within this time."""
STOP_ROUNDS = 50
"""SIGSTOP passes at most, without a freezer: a bomb at the pids limit needs a few."""
GONE_WAIT_S = 5.0
"""How long a hard stop waits for the processes it killed to be gone, their memory and ports
released, before the next kernel starts in the same sandbox."""
STOP_WAIT_S = 1.0
"""How long the SIGSTOP passes of a kill wait, in all, for their processes to stop. One in an
uninterruptible sleep (disk I/O) stops only once it wakes; until then it cannot fork either,
and what it forks afterwards the next pass finds."""
DEAD_STATES = ("Z", "X")
STOPPED_STATES = ("T", "t", *DEAD_STATES)


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of a host process, or None when it is gone.

    The state is its leader's, unless the leader has exited (a zombie) while other threads of
    the process run on: then it is the state of one of those. Such a process is alive (a
    daemon whose main thread called ``pthread_exit``, or a killed one whose last threads are
    still exiting), and its threads hold its files, listening sockets included."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    state = fields[0].decode()
    if state in DEAD_STATES:
        state = _thread_state(pid) or state
    return state, int(fields[1]), int(fields[19])


def _thread_state(pid: int) -> str | None:
    """The state of a thread of process ``pid`` other than its leader that has not exited,
    if there is one."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in threads:
        if tid != str(pid) and (state := _task_state(int(tid))) not in (None, *DEAD_STATES):
            return state
    return None


def _task_state(tid: int) -> str | None:
    """The state of one task (a thread), or None when it is gone."""
    fields = _stat_fields(tid)
    return None if fields is None else fields[0].decode()


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command's name (the state first), or None
    when the task is gone."""
    try:
        data = read_pseudo_file(Path(f"/proc/{pid}/stat"))
    except OSError:
        return None
    return data[data.rindex(b")") + 2 :].split()


def process_alive(pid: int) -> bool:
    """Whether host process ``pid`` runs (neither gone nor a zombie waiting to be reaped)."""
    info = _stat(pid) if pid > 0 else None
    return info is not None and info[0] not in ("Z", "X")


def pidfd_exited(pidfd: int) -> bool:
    """Whether the process ``pidfd`` holds has exited (a pidfd reads ready then), at once.

    poll(2), not select(2): select refuses descriptors past 1023, and a gateway holding a
    hundred kernels (their ZMQ sockets, their sandboxes' pidfds) opens that many."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def signal_init(init_pid: int, container_id: str, signum: int) -> bool:
    """Send ``signum`` to container ``container_id``'s PID 1, host pid ``init_pid``, from the
    host, not through the engine (whose every signal is a ``runc kill``, one more start of a
    Go program): whether it was sent (not: no pid, ended already, not this container's any
    more, or not ours to signal).

    The pid came from an earlier look at the engine: it is checked to be in the container's
    cgroup once a pidfd holds the process, so a pid reused since is never hit."""
    if init_pid <= 1 or not container_id:
        return False
    try:
        pidfd = os.pidfd_open(init_pid)
    except OSError:
        return False
    try:
        if container_id not in Path(f"/proc/{init_pid}/cgroup").read_text():
            return False
        signal.pidfd_send_signal(pidfd, signum)
        return True
    except OSError:
        return False
    finally:
        os.close(pidfd)


def end_init(init_pid: int, container_id: str, freezer: Freezer | None) -> bool:
    """SIGKILL to the container's PID 1 (:func:`signal_init`): its pid namespace ends with it,
    every process of the container at once. A frozen container (a warm kernel) is thawed
    after the signal, which a frozen task takes only then."""
    if not signal_init(init_pid, container_id, signal.SIGKILL):
        return False
    if freezer is not None:
        freezer.thaw()
    return True


def session_leaders_below(pid: int) -> dict[int, int]:
    """Host process ``pid``'s children that lead a session of their own (a template's
    service, ``replgate_kernel/service.py``), with their start times."""
    children: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            children += [int(child) for child in read_pseudo_file(
                Path(f"/proc/{pid}/task/{task}/children")).split()]
    except (OSError, ValueError):
        return {}
    found = {}
    for child in children:
        try:
            data = read_pseudo_file(Path(f"/proc/{child}/stat"))
        except OSError:
            continue
        fields = data[data.rindex(b")") + 2 :].split()
        if int(fields[3]) == child and fields[0] not in (b"Z", b"X"):
            found[child] = int(fields[19])
    return found


def still_running(processes: dict[int, int]) -> frozenset[int]:
    """Those of ``processes`` (pid: start time) that run on as the same processes."""
    return frozenset(pid for pid, start in processes.items()
                     if (info := _stat(pid)) is not None and info[2] == start
                     and info[0] not in DEAD_STATES)


def _read_pids(procs_file: Path) -> list[int]:
    try:
        return [int(line) for line in read_pseudo_file(procs_file).split()]
    except (OSError, ValueError):
        return []


def find_strays(procs_file: Path, init_pid: int, kernel_pid: int,
                keep_kernel_children: bool, spared: Collection[int] = (),
                ) -> dict[int, tuple[str, int, int]]:
    """The container's processes to kill, by host pid (zombies excluded: only a wait ends them).

    ``spared`` are running shell commands: they and their descendants are kept.
    """
    pids = _read_pids(procs_file)
    if set(pids) <= {init_pid, kernel_pid}:
        return {}  # the usual case: one read, nothing else to look at
    found = {pid: info for pid in pids if (info := _stat(pid)) is not None}
    strays = {}
    for pid, info in found.items():
        if pid in (init_pid, kernel_pid) or pid in spared or info[0] == "Z":
            continue
        if keep_kernel_children and _descends(pid, kernel_pid, found):
            continue
        if any(_descends(pid, command, found) for command in spared):
            continue
        strays[pid] = info
    return strays


def _descends(pid: int, ancestor: int, found: dict[int, tuple[str, int, int]]) -> bool:
    for _ in range(len(found) + 1):
        info = found.get(pid)
        if info is None:
            return False
        pid = info[1]
        if pid == ancestor:
            return True
    return False


def kill_strays(procs_file: Path, init_pid: int, kernel_pid: int,
                keep_kernel_children: bool, spared: Collection[int] = (),
                freezer: Freezer | None = None) -> int:
    """Kill what :func:`find_strays` finds, and wait until it is gone; how many were killed.

    Each pass stops every process first (``freezer``, else SIGSTOP pass after pass until a
    pass finds none running), kills the strays, lets them go and waits for their end; one
    that outlived that (a fork caught half-way) is the next pass's.
    """
    def find() -> dict[int, tuple[str, int, int]]:
        return find_strays(procs_file, init_pid, kernel_pid, keep_kernel_children, spared)

    return _reap(find, freezer)


def _reap(find: Callable[[], dict[int, tuple[str, int, int]]], freezer: Freezer | None) -> int:
    """Pass after pass, stop everything, kill what ``find`` finds, let it go and wait for its
    end, until a pass finds nothing (within :data:`KILL_WITHIN_S`); how many were killed."""
    killed: set[tuple[int, int]] = set()
    deadline = time.monotonic() + KILL_WITHIN_S
    while time.monotonic() < deadline:
        frozen = freezer.freeze() if freezer is not None else False
        if frozen is None:
            break  # frozen by someone else (a pause): nothing runs, the next execution's turn
        try:
            victims = _signal(find() if frozen else _stopped(find), signal.SIGKILL)
        finally:
            if frozen and freezer is not None:
                freezer.thaw()
        if not victims:
            break
        killed |= victims
        _wait_dead(victims)
    return len(killed)


def _stopped(find: Callable[[], dict[int, tuple[str, int, int]]],
             ) -> dict[int, tuple[str, int, int]]:
    """SIGSTOP to what ``find`` finds, pass after pass until a pass finds none it has not
    stopped: a stopped process forks no more and keeps its pid (its slot under the pids
    limit), so each pass finds fewer. What was found, stopped, with every process stopped on
    the way (one may have left what ``find`` looks at since: a tree's, when its parent died).

    A pass counts only once the processes it signalled have stopped: the signal is delivered
    on their way back from the kernel, so one caught inside ``fork`` stops only once its child
    exists; a list read before that lacked the child, which then outlived the kill (out of a
    killed tree, re-parented to PID 1), the race a growing bomb won."""
    stopped: dict[int, tuple[str, int, int]] = {}
    found: dict[int, tuple[str, int, int]] = {}
    settled = True
    wait_until = time.monotonic() + STOP_WAIT_S
    for _ in range(STOP_ROUNDS):
        found = find()
        running = {pid: info for pid, info in found.items()
                   if stopped.get(pid, ("", 0, -1))[2] != info[2]}
        if not running and settled:
            break
        signalled = _signal(running, signal.SIGSTOP)
        stopped.update((pid, running[pid]) for pid, _ in signalled)
        # The whole list again, not only the new: one slow to stop (a loaded host) is waited
        # for by the next pass, within the one budget.
        listed = signalled | {(pid, info[2]) for pid, info in found.items()}
        settled = _wait_state(listed, STOPPED_STATES, max(0.0, wait_until - time.monotonic()))
        settled = settled or time.monotonic() >= wait_until
    else:
        found = find()
    return {**stopped, **found}


def _signal(processes: dict[int, tuple[str, int, int]], signum: int) -> set[tuple[int, int]]:
    """``signum`` to each process still the one listed (its start time re-checked through a
    pidfd, so a pid reused meanwhile is never hit); the (pid, start time) of each signalled."""
    sent = set()
    for pid, info in processes.items():
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            now = _stat(pid)
            if now is not None and now[2] == info[2]:
                signal.pidfd_send_signal(fd, signum)
                sent.add((pid, info[2]))
        except OSError:
            pass
        finally:
            os.close(fd)
    return sent


def _wait_dead(processes: Collection[tuple[int, int]], timeout_s: float = GONE_WAIT_S) -> bool:
    """Wait until none of ``processes`` (pid, start time) runs (gone, or a zombie its parent
    has yet to reap); False when some still do at ``timeout_s``."""
    return _wait_state(processes, DEAD_STATES, timeout_s)


def _wait_state(processes: Collection[tuple[int, int]], states: Collection[str],
                timeout_s: float = STOP_WAIT_S) -> bool:
    """Wait until each of ``processes`` (pid, start time) is in one of ``states`` or gone;
    False when some are not at ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    left = list(processes)
    while True:
        left = [(pid, start) for pid, start in left
                if (info := _stat(pid)) is not None and info[2] == start
                and info[0] not in states]
        if not left:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)


def wait_gone(procs_file: Path, init_pid: int, timeout_s: float = GONE_WAIT_S) -> bool:
    """Wait until no thread but PID 1's is left in the container (zombies aside); False when
    some still run at ``timeout_s`` (one stuck in the kernel, say). A killed kernel holds its
    memory and its listening ports until it has exited: the next one would meet both.

    Threads, not processes: a killed process leaves the cgroup's list of processes once its
    leader has exited and its other threads are on their way out, but the last of those
    frees the memory and only then closes the files (the egress forwarder's listening
    ``127.0.0.1:3128`` among them: a restarted kernel met it still bound). The list of
    threads (``tasks``, ``cgroup.threads`` under cgroup v2) shows each until it is past both.
    """
    threads_file = _threads_file(procs_file)
    deadline = time.monotonic() + timeout_s
    while _others_left(threads_file, init_pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _threads_file(procs_file: Path) -> Path:
    """The list of threads beside a cgroup's list of processes (v2's name, else v1's)."""
    threads = procs_file.with_name("cgroup.threads")
    return threads if threads.exists() else procs_file.with_name("tasks")


def _others_left(threads_file: Path, init_pid: int) -> bool:
    """Whether a thread in the list is neither PID 1's nor exited."""
    for tid in _read_pids(threads_file):
        if (os.path.exists(f"/proc/{init_pid}/task/{tid}")
                or _task_state(tid) in (None, *DEAD_STATES)):
            continue
        return True
    return False


def kill_tree(procs_file: Path, root_pid: int, spared_levels: int,
              freezer: Freezer | None = None) -> int:
    """Kill ``root_pid``'s tree but its top ``spared_levels`` levels (0: the whole tree, the
    root too; 1: its descendants) and wait until they are gone; how many were killed. Each
    pass stops everything first, as :func:`kill_strays` does (the container's freezer, else
    SIGSTOP until none of the tree runs), so that a fork bomb forks no more and no child is
    re-parented out of the tree between finding it and killing it."""
    return _reap(lambda: _tree(procs_file, root_pid, spared_levels), freezer)


def _tree(procs_file: Path, root_pid: int, spared_levels: int,
          ) -> dict[int, tuple[str, int, int]]:
    """The living processes of the root's tree below its top ``spared_levels`` levels."""
    found = {pid: info for pid in _read_pids(procs_file) if (info := _stat(pid)) is not None}
    tree = {}
    for pid, info in found.items():
        level, current = 0, pid
        while current != root_pid and level <= len(found):
            parent = found.get(current)
            if parent is None:
                break
            current, level = parent[1], level + 1
        if current == root_pid and level >= spared_levels and info[0] != "Z":
            tree[pid] = info
    return tree
