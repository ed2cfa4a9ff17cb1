"""The reaping of processes left behind (docker._strays, docker._freezer, docker._gvisor), on
real containers of the sandbox image at the sandbox's pids limit, against a shell fork bomb
kept alive by a relauncher (alone it dies out now and then, its forks all failing at once).

The verdicts come from the host: the container's cgroup under runc, ``runsc ps`` under gVisor.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
import requests.exceptions
from kp_support import OWNER

from kernel_pool.backends.docker import LABEL_OWNER
from kernel_pool.backends.docker._freezer import Freezer
from kernel_pool.backends.docker._gvisor import SETTLE_S, Runsc
from kernel_pool.backends.docker._gvisor_table import kernel_descendants, strays_of
from kernel_pool.backends.docker._strays import (
    find_strays,
    kill_strays,
    kill_tree,
    pidfd_exited,
    wait_gone,
)
from kernel_pool.config import Profile

PIDS = 128
RELAUNCHER = """
import subprocess, time
while True:
    try:
        subprocess.Popen(['sh', '-c', 'b(){ b|b& }; b'], stderr=subprocess.DEVNULL)
    except OSError:
        pass
    time.sleep(0.05)
"""


def _container(client: docker.DockerClient, **options: Any) -> Any:
    options = {"pids_limit": PIDS, **options}
    container = client.containers.run(
        Profile().image, ["sleep", "600"], detach=True, network_mode="none", user="1000:1000",
        labels={LABEL_OWNER: OWNER}, **options)
    container.reload()
    return container


@pytest.fixture
def runc_box(docker_client: docker.DockerClient) -> Iterator[Any]:
    container = _container(docker_client)
    try:
        yield container
    finally:
        _remove(container)


def _remove(container: Any) -> None:
    """Force-remove, waiting past the engine client's 60 s timeout: under gVisor, a sandbox left
    with a fork bomb's hundred processes can take the engine over a minute (CI met it)."""
    for _ in range(5):
        try:
            container.remove(force=True)
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: its removal is under way
                raise
            time.sleep(1)
        except requests.exceptions.ReadTimeout:
            continue


def _bomb(container: Any) -> None:
    """The bomb, and its relauncher: both exec'd, so neither descends from a kernel."""
    container.exec_run(["python", "-c", RELAUNCHER], user="1000:1000", detach=True)


def _procs(container: Any) -> Path:
    pid = container.attrs["State"]["Pid"]
    line = next(x for x in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                if ":pids:" in x)
    return Path("/sys/fs/cgroup/pids") / line.split(":", 2)[2].lstrip("/") / "cgroup.procs"


def _at_the_limit(procs: Path, init: int) -> None:
    """Wait until the bomb's living processes fill half the limit (the rest is its dying
    processes, zombies until reaped). Not ``pids.current``: it also counts the last round's
    zombies until PID 1 has reaped them all, and read then it said "at the limit" while the
    new bomb was one process (a CI failure)."""
    deadline = time.monotonic() + 20
    while len(find_strays(procs, init, 0, False)) < PIDS // 2:
        assert time.monotonic() < deadline, "the bomb did not reach half the pids limit"
        time.sleep(0.05)


@pytest.mark.parametrize("frozen", [True, False], ids=["freezer", "sigstop"])
def test_kill_strays_reaps_a_fork_bomb_at_once(runc_box: Any, frozen: bool) -> None:
    init = int(runc_box.attrs["State"]["Pid"])
    procs = _procs(runc_box)
    freezer = Freezer.for_pid(init, runc_box.id) if frozen else None
    assert (freezer is not None) is frozen, "the tests run as root, on a host with a freezer"
    for _ in range(3):  # again and again: each time the bomb is at the limit
        _bomb(runc_box)
        _at_the_limit(procs, init)
        killed = kill_strays(procs, init, 0, False, (), freezer)
        # Returned once they are gone: nothing to wait for, nothing but PID 1 left.
        assert killed > 1 and find_strays(procs, init, 0, False) == {}
        if freezer is not None:
            assert freezer.freeze() is True  # left thawed: it is free to freeze again
            freezer.thaw()
    time.sleep(0.5)
    assert find_strays(procs, init, 0, False) == {}  # the relauncher went too: none came back


def test_kill_strays_leaves_a_paused_container_to_its_pause(runc_box: Any) -> None:
    init = int(runc_box.attrs["State"]["Pid"])
    procs = _procs(runc_box)
    freezer = Freezer.for_pid(init, runc_box.id)
    assert freezer is not None
    runc_box.exec_run(["sleep", "601"], user="1000:1000", detach=True)
    deadline = time.monotonic() + 10
    while not find_strays(procs, init, 0, False):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    runc_box.pause()
    try:
        assert freezer.freeze() is None  # the engine's freeze, not ours to end
        assert kill_strays(procs, init, 0, False, (), freezer) == 0
        runc_box.reload()
        assert runc_box.attrs["State"]["Paused"]
    finally:
        runc_box.unpause()
    assert kill_strays(procs, init, 0, False, (), freezer) == 1


LINGERER = """
import ctypes, socket, threading, time
listener = socket.socket()
listener.bind(('127.0.0.1', 4000))
listener.listen()
threading.Thread(target=time.sleep, args=(600,)).start()
ctypes.CDLL(None).pthread_exit(None)
"""
"""A process whose leader exits (a zombie) while a thread of it runs on, holding its files."""


def _listening(init: int, port: int) -> bool:
    """Whether a socket listens on ``port`` in the network namespace of host pid ``init``."""
    lines = Path(f"/proc/{init}/net/tcp").read_text().splitlines()[1:]
    return any(f[1].endswith(f":{port:04X}") and f[3] == "0A" for f in map(str.split, lines))


def _zombie_leaders(procs: Path, init: int) -> list[int]:
    listed = [int(pid) for pid in procs.read_text().split() if int(pid) != init]
    return [pid for pid in listed
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"]


def test_a_process_whose_leader_exited_is_killed_and_waited_for(runc_box: Any) -> None:
    """Its leader a zombie, a thread of it running on: alive, so it is found, killed, and a
    restart's wait lasts until that thread is gone too (it held a listening port: a killed
    kernel's last threads, still exiting, held the egress forwarder's, and the next kernel
    met it bound)."""
    init = int(runc_box.attrs["State"]["Pid"])
    procs = _procs(runc_box)
    runc_box.exec_run(["python", "-c", LINGERER], user="1000:1000", detach=True)
    deadline = time.monotonic() + 10
    while not (_listening(init, 4000) and _zombie_leaders(procs, init)):
        assert time.monotonic() < deadline, "the lingerer's leader did not exit"
        time.sleep(0.05)
    assert len(find_strays(procs, init, 0, False)) == 1
    assert not wait_gone(procs, init, 0.3)
    assert kill_strays(procs, init, 0, False) == 1
    assert wait_gone(procs, init, 0.3)
    assert not _listening(init, 4000)


@pytest.fixture
def gvisor_box(docker_client: docker.DockerClient) -> Iterator[Runsc]:
    container = _container(docker_client, runtime="runsc",
                           ulimits=[docker.types.Ulimit(name="nproc", soft=PIDS, hard=PIDS)],
                           pids_limit=4 * PIDS)
    try:
        runsc = Runsc.for_sandbox(int(container.attrs["State"]["Pid"]), str(container.id))
        assert runsc is not None
        yield runsc
    finally:
        _remove(container)


def _gvisor_exec(runsc: Runsc, *command: str) -> None:
    subprocess.run(["docker", "exec", "-d", "-u", "1000:1000", runsc.container_id, *command],
                   check=True, capture_output=True)


async def test_gvisor_kill_strays_pauses_reaps_a_fork_bomb_and_resumes(
        gvisor_box: Runsc) -> None:
    _gvisor_exec(gvisor_box, "sleep", "602")  # engine-started, as the kernel is: spared
    for _ in range(3):
        # Its shell exits at once: the relauncher is re-parented to PID 1, a stray.
        _gvisor_exec(gvisor_box, "sh", "-c", 'python -c "$0" &', RELAUNCHER)
        deadline = time.monotonic() + 30
        while len(strays_of(await gvisor_box.processes() or {}, True)) < PIDS // 2:
            assert time.monotonic() < deadline, "the bomb did not grow"
            await asyncio.sleep(0.05)
        killed = await gvisor_box.kill_strays(keep_kernel_children=True)
        assert killed is not None and killed > 1
        left = await gvisor_box.processes() or {}
        assert strays_of(left, True) == [], left  # at once, and the relauncher with them
        assert set(left.values()) == {0}, left  # PID 1 and the sleep
    # Resumed: the sandbox runs what comes next.
    before = len(await gvisor_box.processes() or {})
    _gvisor_exec(gvisor_box, "sleep", "603")
    deadline = time.monotonic() + 10
    while len(await gvisor_box.processes() or {}) <= before:
        assert time.monotonic() < deadline, "the sandbox stayed paused"
        await asyncio.sleep(0.05)


def test_freezer_is_refused_for_a_pid_of_another_cgroup(runc_box: Any) -> None:
    """A pid read from the engine earlier may be another process's by now: the freezer is
    only found when the pid's cgroup is the container's own."""
    init = int(runc_box.attrs["State"]["Pid"])
    assert Freezer.for_pid(init, runc_box.id) is not None
    assert Freezer.for_pid(init, "0" * 64) is None
    assert Freezer.for_pid(os.getpid(), runc_box.id) is None



TREE_BOMB = """
import os, time
time.sleep(0.05)
while True:
    try:
        os.fork()
    except OSError:
        time.sleep(0.01)  # at the pids limit: none exits, so the whole bomb stays one tree
"""


@pytest.mark.parametrize("frozen", [True, False], ids=["freezer", "sigstop"])
def test_kill_tree_reaps_a_fork_bomb_caught_mid_growth(runc_box: Any, frozen: bool) -> None:
    """A context's hard stop kills its kernel's tree while a bomb there still doubles: some
    of its processes are inside ``fork`` at the walk. A child born after the last list was
    read outlived its killed parent, re-parented out of the tree (4 bombs in 20 survived, and
    grew to the limit, before a SIGSTOP pass waited for its processes to stop)."""
    init = int(runc_box.attrs["State"]["Pid"])
    procs = _procs(runc_box)
    freezer = Freezer.for_pid(init, runc_box.id) if frozen else None
    for grow_s in (0.0, 0.005, 0.01, 0.02, 0.05) * 3:
        runc_box.exec_run(["python", "-c", TREE_BOMB], user="1000:1000", detach=True)
        deadline = time.monotonic() + 10
        while len(found := find_strays(procs, init, 0, False)) < 1:
            assert time.monotonic() < deadline, "the bomb's root did not start"
            time.sleep(0.001)
        root = min(found, key=lambda pid: found[pid][2])  # the first started: exec'd
        while len(find_strays(procs, init, 0, False)) < 2:
            assert time.monotonic() < deadline, "the bomb did not start"
            time.sleep(0.001)
        time.sleep(grow_s)
        assert kill_tree(procs, root, 0, freezer) >= 2
        assert find_strays(procs, init, 0, False) == {}, grow_s
        time.sleep(0.05)
        assert find_strays(procs, init, 0, False) == {}, grow_s  # nothing came back


async def test_gvisor_kill_strays_waits_out_a_double_fork_under_the_kernel(
        gvisor_box: Runsc) -> None:
    # An engine-started shell (as the kernel is) whose child forks a sleep and exits 40 ms
    # later: at the first look the sleep is the kernel's grandchild (kept), then PID 1's.
    _gvisor_exec(gvisor_box, "sh", "-c", 'sh -c "sleep 606 & sleep 0.04" & sleep 600')
    deadline = time.monotonic() + 10
    while len(kernel_descendants(await gvisor_box.processes() or {})) < 2:
        assert time.monotonic() < deadline, "the double fork did not start"
        await asyncio.sleep(0.002)
    assert await gvisor_box.kill_strays(keep_kernel_children=True) == 1
    left = await gvisor_box.processes() or {}
    assert 1 not in left.values(), left  # the orphaned sleep is gone; the root shell runs
    # What the kernel keeps is looked at again only when it changed: no wait now.
    started = time.monotonic()
    assert await gvisor_box.kill_strays(keep_kernel_children=True) == 0
    assert time.monotonic() - started < SETTLE_S


def test_pidfd_exited_takes_descriptors_past_1023() -> None:
    # A gateway holding a hundred kernels has descriptors past select(2)'s 1023 (which
    # refused them: "filedescriptor out of range in select()", a 500 for the create).
    child = subprocess.Popen(["sleep", "30"])
    pidfd = os.pidfd_open(child.pid)
    high = os.dup2(pidfd, 1500, inheritable=False)
    try:
        assert not pidfd_exited(high)
        child.kill()
        child.wait()
        assert pidfd_exited(high)
    finally:
        os.close(high)
        os.close(pidfd)
