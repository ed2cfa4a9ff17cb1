"""The gVisor runtime's engine check and its process clean-up rules (docker._gvisor).

The check reads the real engine's ``docker info``; the engine as configured by ./run.sh has
runsc registered, so the missing cases take that real answer and remove from it.
"""

from __future__ import annotations

import json
from typing import Any

import docker
import pytest

from kernel_pool.backends.docker._gvisor import (
    GVISOR_ARGS,
    host_pids_limit,
    missing_runtime,
    strays_of,
)
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


def test_strays_of_spares_init_engine_started_and_kernel_children() -> None:
    # 1 init; 2 the kernel (started by the engine: parent 0); 3 its child; 4 a daemon
    # re-parented to init; 5 a grandchild of the kernel; 6 a second engine-started process.
    processes = {1: 0, 2: 0, 3: 2, 4: 1, 5: 3, 6: 0}
    assert strays_of(processes, keep_kernel_children=True) == [4]
    assert sorted(strays_of(processes, keep_kernel_children=False)) == [3, 4, 5]


def test_host_pids_limit_leaves_the_sentry_room() -> None:
    assert host_pids_limit(Profile(pids=128)) > 2 * 128
