"""Pause, resume, fork, and sessions that outlive their kernels and the gateway (real engine)."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import docker
import httpx
import pytest

from tests.conftest import (
    GatewayProcess,
    fill_disk,
    make_gateway,
    running_gateway,
    small_disk,
)

SETUP = """
import numpy as np, threading, random
x = 41
data = {"rows": [1, 2, 3]}
alias = data
def f(v):
    return v + x
class Point:
    def __init__(self, a):
        self.a = a
p = Point(7)
arr = np.arange(10)
worker = threading.Thread(target=lambda: None)
"""


@pytest.fixture(scope="module")
def lifecycle_gateway(docker_client: docker.DockerClient) -> Iterator[GatewayProcess]:
    # The variables pause by name: under the default (`auto`), SETUP's thread would be
    # reason enough for a memory pause.
    with running_gateway(docker_client, max_kernels="4", min_idle="1",
                         pause_with="variables") as process:
        yield process


@pytest.fixture
def alpha(lifecycle_gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=lifecycle_gateway.url, timeout=120,
                      headers=lifecycle_gateway.headers("alpha")) as client:
        yield client


@pytest.fixture
def session_id(alpha: httpx.Client) -> Iterator[str]:
    answer = alpha.post("/v1/sessions", json={})
    assert answer.status_code == 201, answer.text
    sid: str = answer.json()["id"]
    yield sid
    alpha.delete(f"/v1/sessions/{sid}")


@contextmanager
def gateway_client(docker_client: docker.DockerClient, **settings: str) -> Iterator[httpx.Client]:
    """A client of tenant alpha on a gateway of its own with ``settings``."""
    with running_gateway(docker_client, make_gateway(**settings)) as process, \
            httpx.Client(base_url=process.url, headers=process.headers(), timeout=120) as client:
        yield client


def new_session(client: httpx.Client) -> str:
    answer = client.post("/v1/sessions", json={})
    assert answer.status_code == 201, answer.text
    sid: str = answer.json()["id"]
    return sid


def run(client: httpx.Client, sid: str, code: str) -> dict[str, object]:
    answer = client.post(f"/v1/sessions/{sid}/execute", json={"code": code})
    assert answer.status_code == 200, answer.text
    result: dict[str, object] = answer.json()
    assert result["status"] == "ok", result
    return result


def value(client: httpx.Client, sid: str, expression: str) -> str:
    outputs = run(client, sid, expression)["outputs"]
    assert isinstance(outputs, list) and outputs, outputs
    text: str = outputs[-1]["data"]["text/plain"]
    return text


def test_pause_keeps_variables_and_names_what_it_could_not(alpha: httpx.Client,
                                                           session_id: str) -> None:
    run(alpha, session_id, SETUP)
    answer = alpha.post(f"/v1/sessions/{session_id}/pause")
    assert answer.status_code == 200, answer.text
    paused = answer.json()
    assert paused["status"] == "paused"
    assert paused["paused_with"] == "variables"
    assert "worker" in paused["not_kept"]  # a thread is not a variable that can be kept
    assert paused["snapshot_bytes"] > 0
    assert alpha.get(f"/v1/sessions/{session_id}").json()["status"] == "paused"

    answer = alpha.post(f"/v1/sessions/{session_id}/resume")
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "idle"
    assert answer.json()["paused_with"] is None
    assert value(alpha, session_id, "(f(1), p.a, int(arr.sum()), data is alias, np.__name__)") \
        == "(42, 7, 45, True, 'numpy')"


def test_pause_frees_the_kernel_and_its_container(alpha: httpx.Client, session_id: str,
                                                  lifecycle_gateway: GatewayProcess,
                                                  docker_client: docker.DockerClient) -> None:
    def count() -> int:
        return len(docker_client.api.containers(
            all=True, filters={"label": f"io.replgate.owner={lifecycle_gateway.owner}"}))

    def settled_count(expected: int | None = None) -> int:
        """Containers once the warm pool is full again (a resume may take a warm kernel) and
        a paused session's container is removed (that finishes after the pause answers)."""
        deadline = time.monotonic() + 120
        while True:
            pool = httpx.get(f"{lifecycle_gateway.url}/healthz").json()["pool"]
            if pool["starting"] == 0 and pool["idle"] >= 1:
                found = count()
                if expected is None or found == expected or time.monotonic() > deadline:
                    return found
            assert time.monotonic() < deadline, pool
            time.sleep(0.2)

    run(alpha, session_id, "y = 1")
    before = settled_count()
    assert alpha.post(f"/v1/sessions/{session_id}/pause").status_code == 200
    assert settled_count(before - 1) == before - 1
    assert alpha.post(f"/v1/sessions/{session_id}/resume").status_code == 200
    assert settled_count(before) == before


def test_files_of_a_paused_session_work_without_resuming_it(alpha: httpx.Client,
                                                            session_id: str) -> None:
    run(alpha, session_id, "open('kept.txt', 'w').write('before pause')")
    assert alpha.post(f"/v1/sessions/{session_id}/pause").status_code == 200
    assert alpha.get(f"/v1/sessions/{session_id}/files/kept.txt").content == b"before pause"
    assert alpha.put(f"/v1/sessions/{session_id}/files/new.txt", content=b"while paused"
                     ).status_code == 201
    listed = {f["path"] for f in alpha.get(f"/v1/sessions/{session_id}/files").json()}
    assert {"kept.txt", "new.txt"} <= listed
    assert not any(p.startswith(".replgate-snapshot") for p in listed)
    assert alpha.get(f"/v1/sessions/{session_id}").json()["status"] == "paused"
    assert value(alpha, session_id, "open('new.txt').read()") == "'while paused'"


def test_execute_resumes_a_paused_session_by_itself(alpha: httpx.Client,
                                                    session_id: str) -> None:
    run(alpha, session_id, "counter = 5")
    assert alpha.post(f"/v1/sessions/{session_id}/pause").status_code == 200
    assert value(alpha, session_id, "counter + 1") == "6"
    assert alpha.get(f"/v1/sessions/{session_id}").json()["status"] == "idle"


def test_fork_copies_variables_and_files_with_independent_random(
        alpha: httpx.Client, session_id: str) -> None:
    run(alpha, session_id, "import random, numpy as np\nshared = [1, 2]\n"
                           "open('f.txt', 'w').write('parent file')")
    answer = alpha.post(f"/v1/sessions/{session_id}/fork", json={"count": 2,
                                                                  "metadata": {"k": "v"}})
    assert answer.status_code == 201, answer.text
    children = [c["id"] for c in answer.json()]
    try:
        assert len(set(children)) == 2 and session_id not in children
        assert all(c["metadata"] == {"k": "v"} for c in answer.json())
        draws = set()
        for child in children:
            assert value(alpha, child, "shared") == "[1, 2]"
            assert value(alpha, child, "open('f.txt').read()") == "'parent file'"
            draws.add(value(alpha, child, "(random.random(), float(np.random.random()))"))
            run(alpha, child, "shared.append('child')")
        assert len(draws) == 2
        assert value(alpha, session_id, "shared") == "[1, 2]"  # the parent goes on unchanged
    finally:
        for child in children:
            alpha.delete(f"/v1/sessions/{child}")


def test_fork_of_a_paused_session_leaves_it_paused(alpha: httpx.Client,
                                                   session_id: str) -> None:
    run(alpha, session_id, "z = 'from a paused parent'")
    assert alpha.post(f"/v1/sessions/{session_id}/pause").status_code == 200
    answer = alpha.post(f"/v1/sessions/{session_id}/fork", content=b"")
    assert answer.status_code == 201, answer.text
    child = answer.json()[0]["id"]
    try:
        assert value(alpha, child, "z") == "'from a paused parent'"
        assert alpha.get(f"/v1/sessions/{session_id}").json()["status"] == "paused"
    finally:
        alpha.delete(f"/v1/sessions/{child}")


def test_fork_beyond_the_warm_kernels_gives_paused_copies_that_resume_on_first_use(
        alpha: httpx.Client, session_id: str) -> None:
    # Five copies on a gateway of at most four kernels and one warm: the copies without a
    # kernel wait paused, and nothing else is paused to make room for them.
    run(alpha, session_id, "import random\nmark = 'parent'\nopen('g.txt', 'w').write('kept')")
    answer = alpha.post(f"/v1/sessions/{session_id}/fork", json={"count": 5})
    assert answer.status_code == 201, answer.text
    children = answer.json()
    try:
        paused = [c["id"] for c in children if c["status"] == "paused"]
        assert len(paused) >= 4, children
        assert all(c["paused_with"] == "variables" for c in children if c["id"] in paused)
        assert alpha.get(f"/v1/sessions/{session_id}").json()["status"] == "idle"
        draws = set()
        for child in paused[:2]:
            assert value(alpha, child, "(mark, open('g.txt').read())") == "('parent', 'kept')"
            draws.add(value(alpha, child, "random.random()"))
            assert alpha.get(f"/v1/sessions/{child}").json()["status"] == "idle"
        assert len(draws) == 2  # each copy was reseeded when it first resumed
    finally:
        for child in children:
            alpha.delete(f"/v1/sessions/{child['id']}")


def test_fork_count_out_of_range_is_a_400(alpha: httpx.Client, session_id: str) -> None:
    for count in (0, 17, "many"):
        answer = alpha.post(f"/v1/sessions/{session_id}/fork", json={"count": count})
        assert answer.status_code in (400, 422), answer.text
        assert answer.json()["detail"]


def test_pause_of_another_tenants_session_is_a_404(lifecycle_gateway: GatewayProcess,
                                                   session_id: str) -> None:
    with httpx.Client(base_url=lifecycle_gateway.url,
                      headers=lifecycle_gateway.headers("beta")) as beta:
        for action in ("pause", "resume", "fork"):
            assert beta.post(f"/v1/sessions/{session_id}/{action}").status_code == 404


def test_snapshot_is_private_and_deleted_with_its_session(
        alpha: httpx.Client, lifecycle_gateway: GatewayProcess) -> None:
    sid = alpha.post("/v1/sessions", json={}).json()["id"]
    run(alpha, sid, "secret = 'only mine'")
    assert alpha.post(f"/v1/sessions/{sid}/pause").status_code == 200
    folder = lifecycle_gateway.state_dir / "snapshots"
    files = [p for p in folder.iterdir() if p.name.startswith(sid)]
    assert files
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
    assert alpha.delete(f"/v1/sessions/{sid}").status_code == 204
    deadline = time.monotonic() + 10
    while any(p.name.startswith(sid) for p in folder.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(p.name.startswith(sid) for p in folder.iterdir())


def test_resume_of_a_corrupt_snapshot_keeps_the_session_paused(
        alpha: httpx.Client, session_id: str, lifecycle_gateway: GatewayProcess) -> None:
    run(alpha, session_id, "kept = 1")
    assert alpha.post(f"/v1/sessions/{session_id}/pause").status_code == 200
    image = next(p for p in (lifecycle_gateway.state_dir / "snapshots").iterdir()
                 if p.name.startswith(session_id) and not p.name.endswith(".json"))
    good = image.read_bytes()
    image.write_bytes(b"not a snapshot")
    answer = alpha.post(f"/v1/sessions/{session_id}/resume")
    assert answer.status_code == 409, answer.text
    assert "corrupt" in answer.json()["detail"]
    described = alpha.get(f"/v1/sessions/{session_id}").json()
    assert described["status"] == "paused" and "corrupt" in described["reason"]
    assert image.exists()  # nothing deleted: put it right and it resumes
    image.write_bytes(good)
    assert value(alpha, session_id, "kept") == "1"


def test_pause_or_fork_over_the_snapshot_budget_is_a_507_and_the_session_runs_on(
        docker_client: docker.DockerClient) -> None:
    with gateway_client(docker_client, snapshot_budget="4k") as client:
        sid = new_session(client)
        run(client, sid, "import os\nbig = os.urandom(1 << 20)")
        answer = client.post(f"/v1/sessions/{sid}/pause")
        assert answer.status_code == 507, answer.text
        assert "REPLGATE_SNAPSHOT_BUDGET" in answer.json()["detail"]
        described = client.get(f"/v1/sessions/{sid}").json()
        assert described["status"] == "idle" and described["reason"]
        # A fork's paused copies keep snapshots too: over the budget none of the copies is
        # left (all or none), and the parent goes on.
        answer = client.post(f"/v1/sessions/{sid}/fork", json={"count": 3})
        assert answer.status_code == 507, answer.text
        assert [s["id"] for s in client.get("/v1/sessions").json()] == [sid]
        assert value(client, sid, "len(big)") == str(1 << 20)


def test_least_recently_used_session_is_paused_at_max_kernels(
        docker_client: docker.DockerClient) -> None:
    with gateway_client(docker_client, max_kernels="2", min_idle="1") as client:
        first = new_session(client)
        run(client, first, "who = 'first'")
        second = new_session(client)
        run(client, second, "who = 'second'")
        third = client.post("/v1/sessions", json={})
        assert third.status_code == 201, third.text
        assert client.get(f"/v1/sessions/{first}").json()["status"] == "paused"
        assert client.get(f"/v1/sessions/{second}").json()["status"] == "idle"
        # Using the paused one resumes it, pausing the least recently used other.
        assert value(client, first, "who") == "'first'"
        statuses = [client.get(f"/v1/sessions/{s}").json()["status"]
                    for s in (second, third.json()["id"])]
        assert statuses.count("paused") == 1


def test_idle_session_is_paused_after_pause_after_s(docker_client: docker.DockerClient) -> None:
    with gateway_client(docker_client, pause_after_s="1") as client:
        sid = new_session(client)
        run(client, sid, "kept = 'idle'")
        deadline = time.monotonic() + 30
        while client.get(f"/v1/sessions/{sid}").json()["status"] != "paused":
            assert time.monotonic() < deadline, "the idle session was not paused"
            time.sleep(0.2)
        assert value(client, sid, "kept") == "'idle'"


def half_made_sandbox(state_dir: Path) -> list[Path]:
    """What a gateway killed while making a sandbox leaves: its socket folder mounted and its
    workspace folder, but no container, whose label would name the sandbox."""
    socket_folder = state_dir / "run" / secrets.token_hex(6)
    socket_folder.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(socket_folder)],
                   check=True)
    (socket_folder / "kernel").mkdir()
    workspace = state_dir / "workspaces" / socket_folder.name
    workspace.mkdir()
    return [socket_folder, workspace]


def test_sessions_survive_a_stop_and_a_kill_of_the_gateway(
        docker_client: docker.DockerClient) -> None:
    with running_gateway(docker_client, keep_sessions_on_stop="true") as process:
        with httpx.Client(base_url=process.url, headers=process.headers(), timeout=120) as c:
            running = c.post("/v1/sessions", json={}).json()["id"]
            run(c, running, "state = 'running'\nimport threading\n"
                            "t = threading.Thread(target=lambda: None)")
            paused = c.post("/v1/sessions", json={}).json()["id"]
            run(c, paused, "state = 'paused'")
            assert c.post(f"/v1/sessions/{paused}/pause").status_code == 200
        for sig in (signal.SIGTERM, signal.SIGKILL):
            process.stop(sig)
            half_made = half_made_sandbox(process.state_dir)
            process.start()
            assert [path for path in half_made if path.exists()] == [], sig
            with httpx.Client(base_url=process.url, headers=process.headers(),
                              timeout=120) as c:
                assert c.get(f"/v1/sessions/{paused}").json()["status"] == "paused", sig
                # The running kernel was left running: even a thread is still there.
                assert value(c, running, "(state, type(t).__name__)") == \
                    "('running', 'Thread')"
        with httpx.Client(base_url=process.url, headers=process.headers(), timeout=120) as c:
            assert value(c, paused, "state") == "'paused'"
            for sid in (running, paused):
                assert c.delete(f"/v1/sessions/{sid}").status_code == 204


def test_resume_gets_429_only_when_nothing_can_be_paused(
        docker_client: docker.DockerClient) -> None:
    # No wait for room (REPLGATE_CAPACITY_WAIT_S=0): the next test waits.
    with gateway_client(docker_client, max_kernels="1", min_idle="1",
                        capacity_wait_s="0") as client:
        first = new_session(client)
        run(client, first, "mine = 'first'")
        assert client.post(f"/v1/sessions/{first}/pause").status_code == 200
        second = new_session(client)
        busy = httpx.Client(base_url=client.base_url, headers=client.headers, timeout=120)
        with busy:
            # The only kernel is busy: it cannot be paused, so the resume cannot run.
            running = threading.Thread(target=lambda: busy.post(
                f"/v1/sessions/{second}/execute", json={"code": "import time; time.sleep(5)"}))
            running.start()
            time.sleep(2)
            answer = client.post(f"/v1/sessions/{first}/resume")
            running.join()
        assert answer.status_code == 429, answer.text
        assert answer.headers["retry-after"] == "5"
        assert "REPLGATE_MAX_KERNELS" in answer.json()["detail"]
        assert client.get(f"/v1/sessions/{first}").json()["status"] == "paused"
        # Once the other is idle it is paused to make room, and the first resumes.
        assert value(client, first, "mine") == "'first'"
        assert client.get(f"/v1/sessions/{second}").json()["status"] == "paused"


def test_resume_at_the_limit_waits_for_a_session_to_be_idle(
        docker_client: docker.DockerClient) -> None:
    # The only kernel is busy for three seconds: the resume waits (REPLGATE_CAPACITY_WAIT_S),
    # then the other session is paused for it, as a new session's kernel would wait.
    with gateway_client(docker_client, max_kernels="1", min_idle="1") as client:
        first = new_session(client)
        run(client, first, "mine = 'first'")
        assert client.post(f"/v1/sessions/{first}/pause").status_code == 200
        second = new_session(client)
        busy = httpx.Client(base_url=client.base_url, headers=client.headers, timeout=120)
        with busy:
            running = threading.Thread(target=lambda: busy.post(
                f"/v1/sessions/{second}/execute", json={"code": "import time; time.sleep(3)"}))
            running.start()
            time.sleep(1)
            answer = client.post(f"/v1/sessions/{first}/execute", json={"code": "mine"})
            running.join()
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][-1]["data"]["text/plain"] == "'first'"
        assert client.get(f"/v1/sessions/{second}").json()["status"] == "paused"


def test_command_on_a_paused_session_resumes_it(alpha: httpx.Client, session_id: str) -> None:
    run(alpha, session_id, "open('seen.txt', 'w').write('files and variables')\nkept = 1")
    assert alpha.post(f"/v1/sessions/{session_id}/pause").status_code == 200
    answer = alpha.post(f"/v1/sessions/{session_id}/commands", json={"cmd": "cat seen.txt"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["stdout"] == "files and variables"
    assert value(alpha, session_id, "kept") == "1"


# -- paused workspaces give their blocks back ---------------------------------------------------

RESERVED = 256 * 2**20
"""The test gateways' workspace size (``make_gateway``): what a running session reserves."""
LEAN = 8 * 2**20
"""More than a parked workspace of these tests holds (its files, ext4's metadata)."""


def workspace_holding(state_dir: Path, marker: str) -> Path:
    """The host folder of the mounted workspace that holds the file ``marker``."""
    found = list((state_dir / "workspaces").glob(f"*/{marker}"))
    assert len(found) == 1, found
    return found[0].parent


def on_disk(folder: Path) -> int:
    """Bytes the workspace's image takes on the host's disk."""
    return folder.with_suffix(".ext4").stat().st_blocks * 512


def wait_parked(folder: Path) -> None:
    """A pause answers before its container is gone; the workspace is parked after that."""
    deadline = time.monotonic() + 60
    while os.path.ismount(folder) or on_disk(folder) >= LEAN:
        assert time.monotonic() < deadline, f"{folder} was not parked"
        time.sleep(0.1)


def test_a_paused_workspace_holds_only_its_files_until_resumed(
        alpha: httpx.Client, session_id: str, lifecycle_gateway: GatewayProcess) -> None:
    marker = f"marker-{secrets.token_hex(4)}"
    run(alpha, session_id, f"import os\nblob = os.urandom(2**20)\n"
                           f"open('blob.bin', 'wb').write(blob)\nopen({marker!r}, 'w').close()")
    folder = workspace_holding(lifecycle_gateway.state_dir, marker)
    assert on_disk(folder) >= RESERVED
    assert alpha.post(f"/v1/sessions/{session_id}/pause").status_code == 200
    wait_parked(folder)
    # A write to the paused session reserves the workspace, writes, and gives it back.
    assert alpha.put(f"/v1/sessions/{session_id}/files/later.txt", content=b"while paused"
                     ).status_code == 201
    assert not os.path.ismount(folder) and on_disk(folder) < LEAN
    assert alpha.get(f"/v1/sessions/{session_id}").json()["status"] == "paused"

    # A fork's paused copies are parked from the start.
    images = lifecycle_gateway.state_dir / "workspaces"
    before = set(images.glob("*.ext4"))
    forked = alpha.post(f"/v1/sessions/{session_id}/fork", json={"count": 3})
    assert forked.status_code == 201, forked.text
    children = forked.json()
    paused_copies = sum(child["status"] == "paused" for child in children)
    deadline = time.monotonic() + 120
    while httpx.get(f"{lifecycle_gateway.url}/healthz").json()["pool"]["starting"]:
        assert time.monotonic() < deadline  # a refill's new workspace is unmounted a moment
        time.sleep(0.1)
    parked = [image for image in set(images.glob("*.ext4")) - before
              if not os.path.ismount(image.with_suffix(""))]
    assert paused_copies and len(parked) == paused_copies
    assert all(image.stat().st_blocks * 512 < LEAN for image in parked)
    for child in children:
        assert alpha.delete(f"/v1/sessions/{child['id']}").status_code == 204

    resumed = alpha.post(f"/v1/sessions/{session_id}/resume")
    assert resumed.status_code == 200, resumed.text
    assert on_disk(workspace_holding(lifecycle_gateway.state_dir, marker)) >= RESERVED
    assert value(alpha, session_id, "(len(blob), blob == open('blob.bin', 'rb').read(), "
                                    "open('later.txt').read())") \
        == "(1048576, True, 'while paused')"


def test_a_resume_or_write_the_disk_cannot_reserve_is_a_507_and_the_session_stays_paused(
        docker_client: docker.DockerClient) -> None:
    process = make_gateway(max_kernels="1", min_idle="1", workspace_size="48m",
                           state_min_free="1m")
    with small_disk(160) as disk:
        shutil.rmtree(process.state_dir, ignore_errors=True)
        process.state_dir = disk / "state"
        process.env["REPLGATE_STATE_DIR"] = str(process.state_dir)
        with running_gateway(docker_client, process), httpx.Client(
                base_url=process.url, headers=process.headers(), timeout=120) as client:
            paused_session_refuses_what_the_disk_cannot_reserve(client, disk)


def paused_session_refuses_what_the_disk_cannot_reserve(client: httpx.Client,
                                                         disk: Path) -> None:
    sid = new_session(client)
    run(client, sid, "kept = 'variables'\nopen('kept.txt', 'w').write('files')")
    folder = workspace_holding(disk / "state", "kept.txt")
    assert client.post(f"/v1/sessions/{sid}/pause").status_code == 200
    wait_parked(folder)
    filler = disk / "filler"
    fill_disk(filler, leave=16 * 2**20)

    # No warm kernel to resume onto (one kernel at most): the workspace must be reserved.
    answer = client.post(f"/v1/sessions/{sid}/resume")
    assert answer.status_code == 507, answer.text
    assert "more bytes" in answer.json()["detail"]
    answer = client.put(f"/v1/sessions/{sid}/files/new.txt", content=b"refused")
    assert answer.status_code == 507, answer.text
    answer = client.post(f"/v1/sessions/{sid}/execute", json={"code": "kept"})
    assert answer.json()["status"] == "error" and "could not be resumed" in answer.text
    assert client.get(f"/v1/sessions/{sid}").json()["status"] == "paused"
    assert client.get(f"/v1/sessions/{sid}/files/kept.txt").content == b"files"
    assert not os.path.ismount(folder) and on_disk(folder) < LEAN

    filler.unlink()
    assert client.put(f"/v1/sessions/{sid}/files/new.txt", content=b"taken"
                      ).status_code == 201
    assert value(client, sid, "(kept, open('kept.txt').read(), open('new.txt').read())") \
        == "('variables', 'files', 'taken')"
    assert client.delete(f"/v1/sessions/{sid}").status_code == 204


def test_memory_paused_session_survives_gateway_restarts_and_resumes_whole(
        docker_client: docker.DockerClient) -> None:
    with running_gateway(docker_client, keep_sessions_on_stop="true",
                         pause_with="memory") as process:
        with httpx.Client(base_url=process.url, headers=process.headers(), timeout=120) as c:
            sid = new_session(c)
            run(c, sid, "import threading, time\nticks = [0]\n"
                        "def _tick():\n    while True:\n        ticks[0] += 1\n"
                        "        time.sleep(0.01)\n"
                        "threading.Thread(target=_tick, daemon=True).start()\n"
                        "def _gen():\n    yield from range(10)\nnumbers = _gen()\nnext(numbers)")
            paused = c.post(f"/v1/sessions/{sid}/pause")
            assert paused.status_code == 200, paused.text
            assert paused.json()["paused_with"] == "memory", paused.json()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            process.stop(sig)
            process.start()
            with httpx.Client(base_url=process.url, headers=process.headers(),
                              timeout=120) as c:
                about = c.get(f"/v1/sessions/{sid}").json()
                assert (about["status"], about["paused_with"]) == ("paused", "memory"), sig
        with httpx.Client(base_url=process.url, headers=process.headers(), timeout=120) as c:
            # The generator and the thread came back with the process (no dill keeps them).
            assert value(c, sid, "next(numbers)") == "1"
            first = int(value(c, sid, "ticks[0]"))
            time.sleep(0.2)
            assert int(value(c, sid, "ticks[0]")) > first
            assert c.get(f"/v1/sessions/{sid}").json()["reason"] is None
            assert c.delete(f"/v1/sessions/{sid}").status_code == 204
