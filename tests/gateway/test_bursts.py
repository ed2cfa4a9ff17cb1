"""Many session creates at once, each followed by its first execution, on a running gateway: each
is answered 201 or a 429 that says which limit and when to retry, never a 503 or a 500, and every
session created runs its code. (How fast: ``python -m bench --only bursts``.)"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from tests.conftest import CLIENT_TIMEOUT_S, GatewayProcess, make_gateway, running_gateway

BURST = 10
TENANT_LIMIT = 8


@pytest.fixture
def small_gateway(docker_client: docker.DockerClient) -> Iterator[GatewayProcess]:
    """Room for three running kernels (a burst of ten needs sessions paused to make room) and
    eight sessions per tenant."""
    with running_gateway(docker_client, max_kernels="3", min_idle="1",
                         max_sessions_per_tenant=str(TENANT_LIMIT)) as process:
        yield process


async def _create_and_run(client: httpx.AsyncClient) -> dict[str, Any]:
    created = await client.post("/v1/sessions", json={})
    if created.status_code != 201:
        return {"status": created.status_code, "body": created.json(),
                "retry_after": created.headers.get("retry-after")}
    sid = created.json()["id"]
    ran = await client.post(f"/v1/sessions/{sid}/execute", json={"code": "x = 1 + 1\nx"})
    return {"status": 201, "id": sid, "ran": ran.status_code, "result": ran.json()}


async def _burst(process: GatewayProcess, n: int) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=process.url, headers=process.headers(),
                                 timeout=CLIENT_TIMEOUT_S) as client:
        return await asyncio.gather(*(_create_and_run(client) for _ in range(n)))


def test_burst_past_max_kernels_is_created_or_refused_with_retry_after(
        small_gateway: GatewayProcess) -> None:
    answers = asyncio.run(_burst(small_gateway, BURST))
    created = [a for a in answers if a["status"] == 201]
    refused = [a for a in answers if a["status"] != 201]
    # The tenant's limit holds for creates that arrive together (each counts those before
    # it), and refuses with 429, Retry-After and the setting to raise.
    assert len(refused) == BURST - TENANT_LIMIT, refused
    for answer in refused:
        assert answer["status"] == 429, answer
        assert int(answer["retry_after"]) > 0, answer
        assert "REPLGATE_MAX_SESSIONS_PER_TENANT" in answer["body"]["detail"], answer
    # Past three running kernels, each new session waits for one made before it to finish its
    # first execution and be paused: none is refused for want of a kernel.
    for answer in created:
        assert answer["ran"] == 200, answer
        assert answer["result"]["status"] == "ok", answer
        assert answer["result"]["outputs"][-1]["data"]["text/plain"] == "2", answer
    with httpx.Client(base_url=small_gateway.url, headers=small_gateway.headers(),
                      timeout=CLIENT_TIMEOUT_S) as client:
        pool = client.get("/healthz").json()["pool"]
        assert pool["sessions"] == TENANT_LIMIT and pool["in_use"] <= 3, pool
        # Paused to make room, two run again when asked, with what it held.
        paused = [a for a in created
                  if client.get(f"/v1/sessions/{a['id']}").json()["status"] == "paused"]
        assert len(paused) >= TENANT_LIMIT - 3, pool
        for answer in paused[:2]:
            ran = client.post(f"/v1/sessions/{answer['id']}/execute", json={"code": "x + 2"})
            assert ran.json()["outputs"][-1]["data"]["text/plain"] == "4", ran.text


def _open_files_limits(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError(f"no open-files limit for pid {pid}")


def test_a_gateway_started_under_a_soft_limit_of_1024_open_files_raises_it(
        docker_client: docker.DockerClient) -> None:
    # Each running kernel holds about ten descriptors in the gateway: the soft limit services
    # often start with (1024) would refuse the sockets of its hundredth session or so.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard > 1024, "the test needs a hard limit above 1024 to see the raise"
    process = make_gateway(min_idle="1")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        with running_gateway(docker_client, process):
            assert process.process is not None
            assert _open_files_limits(process.process.pid) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
