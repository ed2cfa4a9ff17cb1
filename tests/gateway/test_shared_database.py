"""Two gateway processes on one PostgreSQL database: their executions and commands, through
the API at once, make one audit chain that ``replgate audit verify`` finds whole."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import docker
import httpx
import pytest

from tests.conftest import (
    CLIENT_TIMEOUT_S,
    REPO,
    GatewayProcess,
    create_database,
    drop_database,
    make_gateway,
    running_gateway,
)

RUNS = 12
"""Executions per gateway and client thread."""


@pytest.fixture(scope="module")
def shared_url() -> Iterator[str]:
    url = create_database()
    yield url
    drop_database(url)


@pytest.fixture(scope="module")
def pair(docker_client: docker.DockerClient,
         shared_url: str) -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
    with running_gateway(docker_client, make_gateway(database_url=shared_url)) as one, \
            running_gateway(docker_client, make_gateway(database_url=shared_url)) as two:
        # Each gateway's keys, both gateways knowing both: the keys table is shared.
        yield one, two


def _session(gateway: GatewayProcess) -> str:
    answer = httpx.post(f"{gateway.url}/v1/sessions", headers=gateway.headers(),
                        json={}, timeout=CLIENT_TIMEOUT_S)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def _hammer(gateway: GatewayProcess, session_id: str, tag: str) -> list[str]:
    codes = []
    with httpx.Client(base_url=gateway.url, headers=gateway.headers(),
                      timeout=CLIENT_TIMEOUT_S) as client:
        for n in range(RUNS):
            code = f"print('{tag}-{n}')"
            answer = client.post(f"/v1/sessions/{session_id}/execute", json={"code": code})
            assert answer.status_code == 200 and answer.json()["status"] == "ok", answer.text
            codes.append(code)
            if n % 4 == 0:
                cmd = f"echo {tag}-cmd-{n}"
                answer = client.post(f"/v1/sessions/{session_id}/commands", json={"cmd": cmd})
                assert answer.status_code == 200, answer.text
                codes.append(cmd)
    return codes


def _verify(gateway: GatewayProcess) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", "audit", "verify"],
                          env=gateway.env, capture_output=True, text=True, timeout=60, cwd=REPO)


def test_two_gateways_append_one_whole_audit_chain(
        pair: tuple[GatewayProcess, GatewayProcess]) -> None:
    one, two = pair
    jobs = [(one, _session(one), "one-a"), (one, _session(one), "one-b"),
            (two, _session(two), "two-a"), (two, _session(two), "two-b")]
    with ThreadPoolExecutor(len(jobs)) as threads:
        ran = [code for codes in threads.map(lambda job: _hammer(*job), jobs)
               for code in codes]
    # Recorded after each answer: wait until every record is in (the CLI then sees them all).
    until = time.monotonic() + 30
    while True:
        recorded = [record["code"] for record in one.audit_records()]
        if set(ran) <= set(recorded) or time.monotonic() > until:
            break
        time.sleep(0.1)
    assert sorted(ran) == sorted(code for code in recorded if code in set(ran))
    sessions = {record["session_id"] for record in one.audit_records()}
    assert {session for _, session, _ in jobs} <= sessions
    for gateway in pair:
        verify = _verify(gateway)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert f"ok: {len(recorded)} records" in verify.stdout


def test_a_gateway_starting_leaves_the_others_sessions_alone(
        pair: tuple[GatewayProcess, GatewayProcess]) -> None:
    # At start-up a gateway marks its crashed executions interrupted and forgets its sessions
    # that are gone: on a shared database, only its own.
    one, two = pair
    sid = _session(one)
    with httpx.Client(base_url=one.url, headers=one.headers(),
                      timeout=CLIENT_TIMEOUT_S) as client, ThreadPoolExecutor(1) as thread:
        slow = thread.submit(client.post, f"/v1/sessions/{sid}/execute",
                             json={"code": "import time; time.sleep(600)"})
        time.sleep(1)
        two.stop()
        two.start()
        history = client.get(f"/v1/sessions/{sid}/executions").json()
        assert [entry["status"] for entry in history] == ["running"], history
        assert client.post(f"/v1/sessions/{sid}/interrupt").status_code == 200
        assert slow.result().status_code == 200
        again = client.post(f"/v1/sessions/{sid}/execute", json={"code": "1 + 1"})
        assert again.status_code == 200 and again.json()["status"] == "ok", again.text
