"""Faults around the gateway process itself: SIGKILL mid-execution and start again."""

from __future__ import annotations

import signal
import time

import docker
import httpx

from tests.conftest import containers_of, make_gateway


def test_gateway_sigkill_then_restart_takes_sessions_back(
        docker_client: docker.DockerClient) -> None:
    gateway = make_gateway()
    gateway.start()
    try:
        with httpx.Client(base_url=gateway.url, headers=gateway.headers(), timeout=60) as c:
            sid = c.post("/v1/sessions", json={"env": {"KEPT_ENV": "1"}}).json()["id"]
            c.post(f"/v1/sessions/{sid}/execute",
                   json={"code": "survivor = 41 + 1\nopen('f.txt', 'w').write('file kept')"})
            other = httpx.Client(base_url=gateway.url, headers=gateway.headers(), timeout=2)
            try:
                other.post(f"/v1/sessions/{sid}/execute",
                           json={"code": "import time; time.sleep(30)"})
            except httpx.TimeoutException:
                pass  # the gateway is killed while this execution runs
            finally:
                other.close()
        gateway.stop(signal.SIGKILL)
        assert containers_of(docker_client, gateway.owner), "session containers were lost"

        gateway.start()
        with httpx.Client(base_url=gateway.url, headers=gateway.headers(), timeout=60) as c:
            assert c.get(f"/v1/sessions/{sid}").status_code == 200
            result = c.post(f"/v1/sessions/{sid}/execute", json={
                "code": "import os\nprint(survivor, open('f.txt').read(), "
                        "os.environ['KEPT_ENV'])"}).json()
            assert result["status"] == "ok", result
            assert result["stdout"] == "42 file kept 1\n"
            history = c.get(f"/v1/sessions/{sid}/executions").json()
            statuses = [h["status"] for h in history]
            assert "interrupted" in statuses, statuses
            assert "running" not in statuses[:-1]
            assert c.delete(f"/v1/sessions/{sid}").status_code == 204
    finally:
        gateway.stop()
        deadline = time.monotonic() + 10
        while containers_of(docker_client, gateway.owner) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = containers_of(docker_client, gateway.owner)
        for cid in left:
            docker_client.api.remove_container(cid, force=True)
        assert not left
