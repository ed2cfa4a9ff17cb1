"""The gVisor runtime's engine check, its process clean-up rules and its control socket
(docker._gvisor, docker._gvisor_control).

The check reads the real engine's ``docker info``; the engine as configured by ./run.sh has
runsc registered, so the missing cases take that real answer and remove from it. The process
table and kills are checked on a real gVisor container (whatever the run's runtime), against
what ``runsc ps`` itself reports.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from kp_support import OWNER

from kernel_pool.backends.base import CgroupUsage
from kernel_pool.backends.docker import LABEL_OWNER
from kernel_pool.backends.docker._gvisor import (
    GVISOR_ARGS,
    RUNSC_PATH,
    OutOfMemoryWatch,
    Runsc,
    host_pids_limit,
    missing_runtime,
)
from kernel_pool.backends.docker._gvisor_control import ControlError, SandboxControl
from kernel_pool.backends.docker._gvisor_table import strays_of
from kernel_pool.config import Profile


@pytest.fixture(scope="module")
def runtimes(docker_client: docker.DockerClient) -> dict[str, Any]:
    found: dict[str, Any] = docker_client.info()["Runtimes"]
    return found


def test_missing_runtime_passes_when_engine_has_runsc(runtimes: dict[str, Any]) -> None:
    assert "runsc" in runtimes, "./run.sh registers runsc in the engine it starts"
    assert missing_runtime(runtimes, [Profile(name="hostile", runtime="gvisor")]) is None


def test_missing_runtime_passes_for_runc_profiles_without_runsc(runtimes: dict[str, Any]) -> None:
    without = {k: v for k, v in runtimes.items() if k != "runsc"}
    assert missing_runtime(without, [Profile(name="default")]) is None


def test_missing_runtime_names_the_daemon_json_line_without_runsc(
        runtimes: dict[str, Any]) -> None:
    without = {k: v for k, v in runtimes.items() if k != "runsc"}
    sentence = missing_runtime(without, [Profile(name="default"),
                                         Profile(name="hostile", runtime="gvisor")])
    assert sentence is not None and sentence.count(". ") == 0  # one sentence
    assert "profile hostile asks for runtime gvisor" in sentence and "default" not in sentence
    assert "has no runtime named runsc" in sentence and "/etc/docker/daemon.json" in sentence
    line = sentence[sentence.index('"runtimes"'):sentence.index(" to /etc/docker")]
    assert json.loads("{" + line + "}")["runtimes"]["runsc"]["runtimeArgs"] == list(GVISOR_ARGS)


def test_missing_runtime_names_missing_arguments(runtimes: dict[str, Any]) -> None:
    bare = dict(runtimes, runsc={"path": "/usr/local/bin/runsc"})
    sentence = missing_runtime(bare, [Profile(name="hostile", runtime="gvisor")])
    assert sentence is not None and "without --host-uds=create --network=none" in sentence
    default = missing_runtime(bare, [Profile(name="default", runtime="gvisor")])
    assert default is not None and "profile default (REPLGATE_RUNTIME) asks" in default


def test_strays_of_spares_init_engine_started_and_kernel_children() -> None:
    # 1 init; 2 the kernel (started by the engine: parent 0); 3 its child; 4 a daemon
    # re-parented to init; 5 a grandchild of the kernel; 6 a second engine-started process.
    processes = {1: 0, 2: 0, 3: 2, 4: 1, 5: 3, 6: 0}
    assert strays_of(processes, keep_kernel_children=True) == [4]
    assert sorted(strays_of(processes, keep_kernel_children=False)) == [3, 4, 5]


def test_oom_watch_finds_a_kill_that_left_memory_at_the_limit() -> None:
    watch = OutOfMemoryWatch(limit_bytes=1000, oom_kills=2)
    assert not watch.stuck(CgroupUsage(oom_kills=2, memory_bytes=990))  # no new kill
    assert not watch.stuck(CgroupUsage(oom_kills=3, memory_bytes=990))  # gVisor's moment
    assert watch.stuck(CgroupUsage(oom_kills=3, memory_bytes=990))
    assert not watch.stuck(CgroupUsage(oom_kills=3, memory_bytes=990))  # once per kill


def test_oom_watch_lets_a_kill_that_freed_memory_pass() -> None:
    watch = OutOfMemoryWatch(limit_bytes=1000, oom_kills=0)
    assert not watch.stuck(CgroupUsage(oom_kills=1, memory_bytes=990))
    assert not watch.stuck(CgroupUsage(oom_kills=1, memory_bytes=300))  # gVisor ended it
    assert not watch.stuck(CgroupUsage(oom_kills=None, memory_bytes=None))  # unreadable


def test_host_pids_limit_leaves_the_sentry_room() -> None:
    assert host_pids_limit(Profile(pids=128)) > 2 * 128


@pytest.fixture(scope="module")
def sandbox(docker_client: docker.DockerClient) -> Iterator[Runsc]:
    """A running gVisor container of the sandbox image, reached as the backend reaches it."""
    container = docker_client.containers.run(
        Profile().image, ["sleep", "600"], detach=True, runtime="runsc", network_mode="none",
        user="1000:1000", labels={LABEL_OWNER: OWNER})
    try:
        container.reload()
        runsc = Runsc.for_sandbox(int(container.attrs["State"]["Pid"]), str(container.id))
        assert runsc is not None, "the sandbox process shows runsc's --root"
        yield runsc
    finally:
        container.remove(force=True)


def _runsc_ps(runsc: Runsc) -> set[int]:
    answer = subprocess.run([runsc.binary, f"--root={runsc.root}", "ps", "--format=json",
                             runsc.container_id], capture_output=True, text=True, check=True)
    return set(json.loads(answer.stdout))


def _exec(runsc: Runsc, *command: str) -> None:
    subprocess.run(["docker", "exec", "-d", "-u", "1000:1000", runsc.container_id, *command],
                   check=True, capture_output=True)


def _wait_for(runsc: Runsc, count: int) -> set[int]:
    deadline = time.monotonic() + 10
    while len(found := _runsc_ps(runsc)) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


async def test_control_lists_what_runsc_ps_lists(sandbox: Runsc) -> None:
    _exec(sandbox, "sleep", "601")
    expected = _wait_for(sandbox, 2)
    found = await SandboxControl(sandbox.root, sandbox.container_id).processes(
        sandbox.container_id)
    assert set(found) == expected and len(expected) >= 2
    assert found[1] == 0  # PID 1, started by the engine


async def test_kill_strays_kills_a_daemon_and_spares_the_engine_started(
        sandbox: Runsc) -> None:
    # A daemon: its shell exits at once, so the sleep is re-parented to PID 1 (a stray); the
    # exec'd sleep is one the engine started (parent 0), as the kernel is.
    already = len(_runsc_ps(sandbox))
    _exec(sandbox, "sleep", "602")
    _exec(sandbox, "sh", "-c", "(sleep 603 &); exit 0")
    before = _wait_for(sandbox, already + 2)
    deadline = time.monotonic() + 10
    while not strays_of(await sandbox.processes() or {}, keep_kernel_children=True):
        assert time.monotonic() < deadline, "the daemon's shell did not exit"
        await asyncio.sleep(0.1)
    assert await sandbox.kill_strays(keep_kernel_children=True) >= 1
    # Until the sentry has reaped it: the count alone also drops when the daemon's shell
    # exits, which left the killed stray still listed (seen once in CI).
    deadline = time.monotonic() + 10
    while strays_of(left := await sandbox.processes() or {}, keep_kernel_children=True):
        assert time.monotonic() < deadline, left
        await asyncio.sleep(0.1)
    assert len(left) < len(before)
    assert all(parent == 0 for parent in left.values())


async def test_processes_fall_back_to_runsc_without_the_control_socket(
        sandbox: Runsc, tmp_path: Path) -> None:
    elsewhere = Runsc(sandbox.binary, sandbox.root, sandbox.container_id,
                      control=SandboxControl(str(tmp_path), sandbox.container_id))
    found = await elsewhere.processes()
    assert found is not None and set(found) == _runsc_ps(sandbox)


NAMED = "import signal, sys, time\nopen('/proc/self/comm', 'w').write(sys.argv[1])\n" \
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\ntime.sleep(604)"


@pytest.mark.parametrize("through", ["control", "runsc"])
async def test_signal_exec_reaches_the_process_of_that_name(
        sandbox: Runsc, tmp_path: Path, through: str) -> None:
    runsc = sandbox if through == "control" else Runsc(
        sandbox.binary, sandbox.root, sandbox.container_id,
        control=SandboxControl(str(tmp_path), sandbox.container_id))
    name = f"rg-{through}"
    already = len(_runsc_ps(sandbox))
    _exec(sandbox, "/opt/venv/bin/python", "-c", NAMED, name)
    _wait_for(sandbox, already + 1)
    assert not await runsc.signal_exec("rg-nobody", signal.SIGTERM)
    deadline = time.monotonic() + 10
    while not await runsc.signal_exec(name, signal.SIGTERM):  # once it took its name
        assert time.monotonic() < deadline, "no process took the name"
        await asyncio.sleep(0.1)
    deadline = time.monotonic() + 10
    while len(_runsc_ps(sandbox)) > already:  # it handled the SIGTERM and exited
        assert time.monotonic() < deadline, _runsc_ps(sandbox)
        await asyncio.sleep(0.1)


async def test_control_of_a_gone_sandbox_raises_control_error(sandbox: Runsc) -> None:
    with pytest.raises(ControlError, match="control socket"):
        await SandboxControl(sandbox.root, "0" * 64).processes("0" * 64)


async def test_kill_strays_of_an_unreadable_table_asks_for_a_replacement(
        tmp_path: Path) -> None:
    # Neither the socket nor runsc answers: what runs there is unknown (a bomb may), so the
    # reap is not reported done; the caller replaces the sandbox.
    blind = Runsc(RUNSC_PATH, str(tmp_path), "0" * 64)
    assert await blind.processes() is None
    assert await blind.kill_strays(keep_kernel_children=True) is None
    assert not blind.end_sandbox()  # no sandbox process known: nothing signalled


async def test_end_sandbox_signals_only_its_own_sandbox_process(sandbox: Runsc) -> None:
    # Another process at that pid (here the test's own) is never signalled.
    stranger = Runsc(sandbox.binary, sandbox.root, sandbox.container_id,
                     sandbox_pid=os.getpid())
    assert not stranger.end_sandbox()
    other = Runsc(sandbox.binary, sandbox.root, "0" * 64, sandbox_pid=sandbox.sandbox_pid)
    assert not other.end_sandbox()
    assert await sandbox.processes()  # still running
