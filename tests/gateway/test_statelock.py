"""One gateway per state directory: a second ``replgate serve`` touches nothing of the first."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import docker
import httpx
import pytest

from tests.conftest import (
    REPO,
    GatewayProcess,
    containers_of,
    free_port,
    make_gateway,
    running_gateway,
)

WAIT_FOR_GO = "import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.05)\nprint(x + 1)"


@dataclass
class Busy:
    """Gateway A with a session holding ``x = 41`` and an execution waiting for a file."""

    gateway: GatewayProcess
    client: httpx.Client
    session_id: str
    result: dict[str, object]
    runner: threading.Thread

    def release_and_check(self) -> None:
        """Let the waiting execution end: it must end ok, with the variable still there."""
        answer = self.client.put(f"/v1/sessions/{self.session_id}/files/go", content=b"")
        assert answer.status_code == 201, answer.text
        self.runner.join(60)
        assert self.result.get("status") == "ok", self.result
        assert self.result.get("stdout") == "42\n", self.result
        again = self.client.post(f"/v1/sessions/{self.session_id}/execute",
                                 json={"code": "print(x)"})
        assert again.json()["stdout"] == "41\n", again.text


@pytest.fixture
def busy(docker_client: docker.DockerClient) -> Iterator[Busy]:
    with running_gateway(docker_client) as gateway, httpx.Client(
            base_url=gateway.url, headers=gateway.headers(), timeout=60) as client:
        sid = client.post("/v1/sessions").json()["id"]
        assert client.post(f"/v1/sessions/{sid}/execute",
                           json={"code": "x = 41"}).json()["status"] == "ok"
        result: dict[str, object] = {}

        def run() -> None:
            with httpx.Client(base_url=gateway.url, headers=gateway.headers(),
                              timeout=120) as own:
                result.update(own.post(f"/v1/sessions/{sid}/execute",
                                       json={"code": WAIT_FOR_GO, "timeout_s": 100}).json())

        runner = threading.Thread(target=run)
        runner.start()
        _wait_busy(client, sid)
        yield Busy(gateway, client, sid, result, runner)
        client.put(f"/v1/sessions/{sid}/files/go", content=b"")
        runner.join(60)


def _wait_busy(client: httpx.Client, sid: str) -> None:
    for _ in range(600):
        if client.get(f"/v1/sessions/{sid}").json()["status"] == "busy":
            return
        threading.Event().wait(0.05)
    raise AssertionError("the execution never started")


def _containers(client: docker.DockerClient, gateway: GatewayProcess,
                steady: bool = True) -> dict[str, str]:
    """The gateway's containers (its owner label, its state dir): id and start time (a restart
    changes it); first, unless the gateway is stopped, until its pool is steady."""
    for _ in range(1200 if steady else 0):
        pool = httpx.get(f"{gateway.url}/healthz").json()["pool"]
        if pool["starting"] == 0 and pool["idle"] >= 1:
            break
        threading.Event().wait(0.05)
    found = {}
    for cid in containers_of(client, gateway.env["REPLGATE_OWNER"]):
        details = client.api.inspect_container(cid)
        if details["Config"]["Labels"]["io.replgate.workspace"].startswith(
                f"{gateway.state_dir}/"):
            found[cid] = details["State"]["StartedAt"]
    return found


def _serve(env: dict[str, str], port: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=60)


def test_second_serve_on_same_state_dir_exits_naming_the_first(
        busy: Busy, docker_client: docker.DockerClient) -> None:
    before = _containers(docker_client, busy.gateway)
    second = _serve(busy.gateway.env, free_port())
    assert second.returncode == 1, second.stderr
    assert second.stdout == ""
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1, second.stderr
    assert busy.gateway.process is not None
    assert f"pid {busy.gateway.process.pid}, listening on {busy.gateway.url}" in lines[0]
    assert "REPLGATE_STATE_DIR" in lines[0]
    assert busy.runner.is_alive(), "the first gateway's execution ended early"
    assert _containers(docker_client, busy.gateway) == before
    busy.release_and_check()


def test_serve_on_taken_port_exits_and_touches_nothing(
        busy: Busy, docker_client: docker.DockerClient) -> None:
    before = _containers(docker_client, busy.gateway)
    other = make_gateway(owner=busy.gateway.owner)  # another state dir, the same owner label
    try:
        clash = _serve(other.env, int(busy.gateway.url.rsplit(":", 1)[1]))
        assert clash.returncode == 1, clash.stderr
        lines = clash.stderr.strip().splitlines()
        assert len(lines) == 1 and "cannot listen on" in lines[0], clash.stderr
        assert not (other.state_dir / "replgate.db").exists()
    finally:
        shutil.rmtree(other.state_dir, ignore_errors=True)
    assert busy.runner.is_alive()
    assert _containers(docker_client, busy.gateway) == before
    busy.release_and_check()


def test_gateway_on_other_state_dir_with_same_owner_leaves_sandboxes_alone(
        busy: Busy, docker_client: docker.DockerClient) -> None:
    before = _containers(docker_client, busy.gateway)
    other = make_gateway(owner=busy.gateway.owner)
    try:
        other.start()  # takes back and removes sandboxes: only those of its own state dir
        assert _containers(docker_client, other), "the second gateway started no warm kernel"
        assert _containers(docker_client, busy.gateway) == before
        other.stop()
        assert not _containers(docker_client, other, steady=False), "the second left some"
    finally:
        other.stop()
        shutil.rmtree(other.state_dir, ignore_errors=True)
    assert _containers(docker_client, busy.gateway) == before
    busy.release_and_check()
