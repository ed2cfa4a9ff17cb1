"""What an E2B create asks of the sandbox's end (``lifecycle``: ``autoPause``,
``autoPauseMemory``, ``autoResume``), with the unmodified SDK against a real gateway: a timeout
that pauses, a filesystem-only one that reboots, traffic that resumes, E2B's 400s, the policy
kept across a gateway's restart; and ``mcp``, whose gateway the SDK cannot start in replgate's
sandbox, as in E2B's ``base``."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any
from uuid import uuid4

import docker
import httpx
import pytest
from e2b import SandboxException, SandboxQuery, SandboxState
from e2b_code_interpreter import Sandbox

from tests.conftest import GatewayProcess, running_gateway

pytestmark = pytest.mark.usefixtures("e2b_env")


def wait_for(check: Callable[[], bool], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.3)


def paused(sandbox: Sandbox) -> bool:
    return sandbox.get_info().state == SandboxState.PAUSED


def test_a_timeout_that_pauses_keeps_the_variables_until_connect() -> None:
    sandbox = Sandbox.create(timeout=5, lifecycle={"on_timeout": "pause"})
    try:
        assert sandbox.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": False}
        sandbox.run_code("kept = 41")
        wait_for(lambda: paused(sandbox))
        assert not sandbox.is_running()  # no autoResume: a request does not wake it
        assert paused(sandbox)
        paused_ids = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
        assert sandbox.sandbox_id in [s.sandbox_id for s in paused_ids]
        sandbox.connect(timeout=60)
        assert sandbox.is_running()
        assert sandbox.run_code("kept + 1").text == "42"
    finally:
        sandbox.kill()


def test_a_filesystem_only_timeout_pause_reboots_keeping_the_files() -> None:
    sandbox = Sandbox.create(timeout=5, lifecycle={
        "on_timeout": {"action": "pause", "mode": "filesystem"}})
    try:
        sandbox.files.write("/home/user/marker.txt", "on disk")
        sandbox.run_code("gone = 1")
        wait_for(lambda: paused(sandbox))
        sandbox.connect(timeout=60)
        check = "'gone' in dir(), open('marker.txt').read()"
        assert sandbox.run_code(check).text == "(False, 'on disk')"
    finally:
        sandbox.kill()


def test_auto_resume_wakes_a_timeout_paused_sandbox_on_a_request() -> None:
    sandbox = Sandbox.create(timeout=5, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        assert sandbox.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": True}
        sandbox.run_code("kept = 'across the pause'")
        wait_for(lambda: paused(sandbox))
        assert sandbox.is_running()  # the health request itself resumes it, as on E2B
        info = sandbox.get_info()
        assert info.state == SandboxState.RUNNING
        assert info.end_at.timestamp() - time.time() <= 5  # its create's timeout again
        assert sandbox.run_code("kept").text == "across the pause"
        wait_for(lambda: paused(sandbox))  # and it is paused again at that end
    finally:
        sandbox.kill()


@pytest.mark.parametrize(("body", "said"), [
    ({"autoPauseMemory": False}, "autoPauseMemory=false only applies when autoPause is true"),
    ({"autoPause": True, "autoPauseMemory": False, "autoResume": {"enabled": True}},
     "cannot be auto-resumed by traffic"),
    ({"autoPause": True, "autoResume": {}}, "enabled"),
])
def test_lifecycles_e2bs_server_refuses_are_400_with_a_sentence(
        gateway: GatewayProcess, body: dict[str, Any], said: str) -> None:
    answer = httpx.post(f"{gateway.url}/e2b/v2/sandboxes", headers={
        "X-API-Key": gateway.keys["alpha"]}, json={"templateID": "base", **body}, timeout=60)
    assert answer.status_code == 400, answer.text
    assert said in answer.json()["message"]


def test_the_lifecycle_holds_across_a_gateway_restart(docker_client: docker.DockerClient) -> None:
    with running_gateway(docker_client) as other:
        options: dict[str, Any] = {"api_key": other.keys["alpha"],
                                   "api_url": f"{other.url}/e2b",
                                   "sandbox_url": f"{other.url}/e2b/sandbox"}
        sandbox = Sandbox.create(timeout=8, lifecycle={"on_timeout": "pause"}, **options)
        sandbox.run_code("kept = 'the restart'")
        other.stop(signal.SIGKILL)  # the end is the database's: the next gateway acts on it
        other.start()
        wait_for(lambda: Sandbox.get_info(sandbox.sandbox_id, **options).state
                 == SandboxState.PAUSED)
        assert Sandbox.get_info(sandbox.sandbox_id, **options).lifecycle == {
            "on_timeout": "pause", "auto_resume": False}
        again = Sandbox.connect(sandbox.sandbox_id, **options)
        assert again.run_code("kept").text == "the restart"
        Sandbox.kill(sandbox.sandbox_id, **options)


def test_an_mcp_create_fails_to_start_its_gateway_and_leaves_no_sandbox() -> None:
    metadata = {"mcp_test": uuid4().hex}
    with pytest.raises(SandboxException, match="Failed to start MCP gateway"):
        Sandbox.create("base", metadata=metadata, mcp={"invalid_server": {}})  # type: ignore[arg-type]
    left = Sandbox.list(query=SandboxQuery(metadata=metadata)).next_items()
    assert left == []


def test_a_sandbox_made_from_a_snapshot_gets_its_creates_lifecycle() -> None:
    source = Sandbox.create()
    snapshot = source.create_snapshot()
    try:
        made = Sandbox.create(snapshot.snapshot_id,
                              lifecycle={"on_timeout": "pause", "auto_resume": True})
        try:
            assert made.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": True}
        finally:
            made.kill()
    finally:
        source.kill()
        Sandbox.delete_snapshot(snapshot.snapshot_id)
