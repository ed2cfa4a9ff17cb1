"""The isolation setting per profile, end to end: a policy file's profile asks for gVisor, its
sessions run under runsc and the default profile's under runc, as the engine reports them."""

from __future__ import annotations

from pathlib import Path

import docker
import httpx

from tests.conftest import containers_of, inspected, running_gateway

POLICY = """
[profiles.untrusted]
runtime = "gvisor"
min_idle = 0
"""


def test_profile_runtime_gvisor_runs_sessions_under_runsc(
        docker_client: docker.DockerClient, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    with running_gateway(docker_client, policy_file=str(policy), runtime="runc") as gateway, \
            httpx.Client(base_url=gateway.url, headers=gateway.headers(), timeout=120) as client:
        runtimes = {}
        for profile in ("untrusted", "default"):
            session = client.post("/v1/sessions", json={"profile": profile})
            assert session.status_code == 201, session.text
            sid = session.json()["id"]
            result = client.post(f"/v1/sessions/{sid}/execute",
                                 json={"code": "import os\nprint(os.uname().release)"}).json()
            assert result["status"] == "ok", result
            runtimes[profile] = (_runtimes_of(docker_client, gateway.owner, profile),
                                 result["stdout"])
            assert client.delete(f"/v1/sessions/{sid}").status_code == 204
    assert runtimes["untrusted"][0] == {"runsc"} and runtimes["default"][0] == {"runc"}
    # gVisor's kernel answers uname with its own release, not the host's.
    assert runtimes["untrusted"][1] != runtimes["default"][1]


def _runtimes_of(client: docker.DockerClient, owner: str, profile: str) -> set[str]:
    """The runtimes of every container of one profile of the gateway (warm ones included; one
    removed between the listing and its inspection, a warm kernel recycled, is left out)."""
    runtimes = {config["HostConfig"]["Runtime"]
                for config in inspected(client, containers_of(client, owner, profile=profile))}
    assert runtimes, f"no container of profile {profile}"
    return runtimes
