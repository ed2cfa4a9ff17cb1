"""A session's network policy through the API: set at create, read and changed on a live
session, refused beyond the profile's bound, kept across pause, resume, fork and a restart
of the gateway.

A real ``replgate serve`` with a policy file whose ``open`` profile lets sessions open the
network (``network_max``), real sandboxes, and real HTTP servers in a network namespace made
for the test (:mod:`tests.netns`).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx
import pytest

from tests.conftest import GatewayProcess, running_gateway
from tests.netns import NetnsHost, netns_host

ALLOWED, OTHER = 18180, 18181

POLICY = """
[profiles.open]
min_idle = 1
network_max = { default = "allow", deny = ["192.0.2.0/24"] }

[profiles.listed]
min_idle = 0
egress_allow = ["pypi.org:443"]
"""

GET = """
import requests
for url in {urls!r}:
    try:
        r = requests.get(url, timeout=10)
        print(r.status_code, r.text.strip()[:200])
    except Exception as exc:
        print('failed', type(exc).__name__)
"""


@pytest.fixture(scope="module")
def host() -> Iterator[NetnsHost]:
    with netns_host((ALLOWED, OTHER)) as made:
        yield made


@pytest.fixture(scope="module")
def gateway(docker_client: docker.DockerClient) -> Iterator[GatewayProcess]:
    policy = Path(tempfile.mkdtemp(prefix="rg-np-", dir="/tmp")) / "policy.toml"
    policy.write_text(POLICY)
    with running_gateway(docker_client, policy_file=str(policy), min_idle="0",
                         keep_sessions_on_stop="true") as process:
        yield process


@pytest.fixture(scope="module")
def alpha(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, headers=gateway.headers("alpha"), timeout=120) as c:
        yield c


def only(host: NetnsHost, port: int = ALLOWED) -> dict[str, object]:
    return {"default": "deny", "allow": [f"{host.address}:{port}"], "deny": [], "rules": []}


def create(client: httpx.Client, **body: object) -> str:
    answer = client.post("/v1/sessions", json={"profile": "open", **body})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def fetch(client: httpx.Client, sid: str, *urls: str) -> list[str]:
    answer = client.post(f"/v1/sessions/{sid}/execute",
                         json={"code": GET.format(urls=list(urls)), "timeout_s": 90})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["stdout"]).strip().split("\n")


def test_a_session_created_with_a_policy_reaches_the_allowed_host_only(
        alpha: httpx.Client, host: NetnsHost) -> None:
    sid = create(alpha, network=only(host))
    try:
        assert alpha.get(f"/v1/sessions/{sid}/network").json() == only(host)
        out = fetch(alpha, sid, host.url(ALLOWED, "/x"), host.url(OTHER, "/y"))
        assert out[0] == f"200 hello {ALLOWED} /x"
        assert out[1].startswith("403 replgate egress refused"), out
        log = alpha.get(f"/v1/sessions/{sid}/egress").json()
        assert [(a["port"], a["allowed"]) for a in log[-2:]] == [(ALLOWED, True), (OTHER, False)]
    finally:
        alpha.delete(f"/v1/sessions/{sid}")


def test_a_policy_beyond_the_profile_is_a_403_naming_the_entry(alpha: httpx.Client,
                                                              host: NetnsHost) -> None:
    answer = alpha.post("/v1/sessions", json={"network": only(host)})  # default: no network
    assert answer.status_code == 403
    assert f"'{host.address}:{ALLOWED}'" in answer.json()["detail"]
    answer = alpha.post("/v1/sessions", json={"profile": "listed",
                                              "network": {"allow": ["pypi.org"]}})
    assert answer.status_code == 403 and "'pypi.org'" in answer.json()["detail"]
    sid = create(alpha)
    try:
        answer = alpha.patch(f"/v1/sessions/{sid}/network",
                             json={"allow": ["192.0.2.10:80"]})
        assert answer.status_code == 403 and "'192.0.2.10:80'" in answer.json()["detail"]
        assert alpha.patch(f"/v1/sessions/{sid}/network",
                           json={"allow": ["*"]}).status_code == 422
    finally:
        alpha.delete(f"/v1/sessions/{sid}")


def test_patch_applies_to_the_next_connection_within_a_second(alpha: httpx.Client,
                                                              host: NetnsHost) -> None:
    sid = create(alpha)
    try:
        assert alpha.get(f"/v1/sessions/{sid}/network").json()["allow"] == []
        began = time.monotonic()
        answer = alpha.patch(f"/v1/sessions/{sid}/network", json=only(host, OTHER))
        assert answer.status_code == 200 and answer.json() == only(host, OTHER)
        assert time.monotonic() - began < 1.0  # applied: the next connection is decided by it
        out = fetch(alpha, sid, host.url(OTHER), host.url(ALLOWED))
        assert out[0] == f"200 hello {OTHER} /" and out[1].startswith("403"), out
    finally:
        alpha.delete(f"/v1/sessions/{sid}")


def test_pause_resume_fork_and_a_gateway_restart_keep_the_policy(
        gateway: GatewayProcess, alpha: httpx.Client, host: NetnsHost) -> None:
    sid = create(alpha, network=only(host))
    urls = (host.url(ALLOWED), host.url(OTHER))
    try:
        assert alpha.post(f"/v1/sessions/{sid}/pause").status_code == 200
        assert alpha.post(f"/v1/sessions/{sid}/resume").status_code == 200
        out = fetch(alpha, sid, *urls)
        assert out[0] == f"200 hello {ALLOWED} /" and out[1].startswith("403"), out
        forked = alpha.post(f"/v1/sessions/{sid}/fork", json={"count": 1})
        assert forked.status_code == 201, forked.text
        child = forked.json()[0]["id"]
        assert alpha.get(f"/v1/sessions/{child}/network").json() == only(host)
        out = fetch(alpha, child, *urls)
        assert out[0] == f"200 hello {ALLOWED} /" and out[1].startswith("403"), out
        alpha.post(f"/v1/sessions/{child}/pause")  # one kept paused, one running
        gateway.stop()
        gateway.start()
        for kept in (sid, child):
            assert alpha.get(f"/v1/sessions/{kept}/network").json() == only(host)
            out = fetch(alpha, kept, *urls)
            assert out[0] == f"200 hello {ALLOWED} /" and out[1].startswith("403"), out
        alpha.delete(f"/v1/sessions/{child}")
    finally:
        alpha.delete(f"/v1/sessions/{sid}")
