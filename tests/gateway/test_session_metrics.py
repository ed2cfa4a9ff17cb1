"""``GET /v1/sessions/{id}/metrics`` and E2B's ``getMetrics`` on a real gateway: a busy loop's
CPU, an allocation's memory, a written file's disk, a paused session's memory 0."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from e2b_code_interpreter import AsyncSandbox

from kernel_pool import parse_size
from tests.conftest import GatewayProcess

SPIN = """
import threading, time
def _spin():
    end = time.monotonic() + 8
    while time.monotonic() < end:
        pass
threading.Thread(target=_spin, daemon=True).start()
"""


@pytest.fixture
async def client(gateway: GatewayProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway.url, headers=gateway.headers(),
                                 timeout=120) as http:
        yield http


@pytest.fixture
async def sid(client: httpx.AsyncClient) -> AsyncIterator[str]:
    answer = await client.post("/v1/sessions", json={})
    assert answer.status_code == 201, answer.text
    yield answer.json()["id"]
    await client.delete(f"/v1/sessions/{answer.json()['id']}")


async def run(client: httpx.AsyncClient, sid: str, code: str) -> None:
    answer = await client.post(f"/v1/sessions/{sid}/execute", json={"code": code})
    assert answer.json()["status"] == "ok", answer.json()


async def metrics(client: httpx.AsyncClient, sid: str) -> dict[str, float]:
    answer = await client.get(f"/v1/sessions/{sid}/metrics")
    assert answer.status_code == 200, answer.text
    figures: dict[str, float] = answer.json()
    assert set(figures) == {"cpu_used_pct", "mem_used_bytes", "mem_limit_bytes",
                            "disk_used_bytes", "disk_limit_bytes", "at"}
    at = datetime.fromisoformat(str(figures["at"]))
    assert abs(datetime.now(UTC) - at) < timedelta(seconds=10)
    return figures


async def test_metrics_show_cpu_memory_and_disk_then_memory_0_when_paused(
        gateway: GatewayProcess, client: httpx.AsyncClient, sid: str) -> None:
    await run(client, sid, "import os\nblob = b'x' * (100 * 2**20)\n"
                           "open('data.bin', 'wb').write(os.urandom(20 * 2**20))")
    idle = await metrics(client, sid)
    await run(client, sid, SPIN)
    await metrics(client, sid)  # a reading since the idle one; the next is spinning alone
    await asyncio.sleep(2)
    busy = await metrics(client, sid)
    # A spinning thread's share is what the machine leaves it (more than half of the limit on
    # a quiet one): clearly more than the idle session's, never past the limit.
    assert busy["cpu_used_pct"] > max(10.0, 2 * idle["cpu_used_pct"]), (idle, busy)
    assert busy["cpu_used_pct"] <= 100
    assert busy["mem_used_bytes"] >= 100 * 2**20
    assert busy["mem_used_bytes"] < busy["mem_limit_bytes"]
    assert busy["disk_used_bytes"] >= 20 * 2**20
    assert busy["disk_limit_bytes"] == parse_size(gateway.env["REPLGATE_WORKSPACE_SIZE"])
    answer = await client.post(f"/v1/sessions/{sid}/pause")
    assert answer.json()["status"] == "paused"
    paused = await metrics(client, sid)
    assert (paused["mem_used_bytes"], paused["cpu_used_pct"]) == (0, 0)
    assert paused["disk_used_bytes"] == busy["disk_used_bytes"]  # its last figure
    assert paused["mem_limit_bytes"] == busy["mem_limit_bytes"]
    info = await client.get(f"/v1/sessions/{sid}")
    assert info.json()["status"] == "paused"  # asking did not resume it


async def test_metrics_of_another_tenants_session_are_a_404(
        gateway: GatewayProcess, sid: str) -> None:
    async with httpx.AsyncClient(base_url=gateway.url, headers=gateway.headers("beta")) as beta:
        assert (await beta.get(f"/v1/sessions/{sid}/metrics")).status_code == 404


async def test_e2b_get_metrics_maps_onto_the_sessions_figures(
        gateway: GatewayProcess, client: httpx.AsyncClient,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E2B_API_URL", f"{gateway.url}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{gateway.url}/e2b/sandbox")
    monkeypatch.setenv("E2B_API_KEY", gateway.keys["alpha"])
    sandbox = await AsyncSandbox.create()
    try:
        await sandbox.run_code("blob = b'x' * (64 * 2**20)")
        [entry] = await sandbox.get_metrics()
        assert entry.mem_used >= 64 * 2**20
        assert entry.mem_total > entry.mem_used
        assert entry.cpu_count >= 1
        assert 0 <= entry.cpu_used_pct <= 100
        assert 0 < entry.disk_used <= entry.disk_total
        assert abs(datetime.now(UTC) - entry.timestamp) < timedelta(seconds=10)
        figures = await metrics(client, sandbox.sandbox_id)
        assert entry.mem_total == figures["mem_limit_bytes"]
        assert entry.disk_total == figures["disk_limit_bytes"]
    finally:
        await sandbox.kill()


async def test_e2b_get_metrics_gives_the_readings_between_start_and_end(
        gateway: GatewayProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E2B_API_URL", f"{gateway.url}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{gateway.url}/e2b/sandbox")
    monkeypatch.setenv("E2B_API_KEY", gateway.keys["alpha"])
    before = datetime.now(UTC)
    sandbox = await AsyncSandbox.create()
    try:
        [first] = await sandbox.get_metrics()
        await asyncio.sleep(2.5)
        both = await sandbox.get_metrics(start=before)  # reaches now: a reading now too
        assert [m.timestamp for m in both][:1] == [first.timestamp] and len(both) == 2
        assert both[1].timestamp - first.timestamp >= timedelta(seconds=2)
        only_first = await sandbox.get_metrics(start=first.timestamp, end=first.timestamp)
        assert [m.timestamp for m in only_first] == [first.timestamp]
        assert await sandbox.get_metrics(start=before - timedelta(hours=1),
                                         end=before - timedelta(minutes=30)) == []
    finally:
        await sandbox.kill()


async def test_e2b_get_metrics_with_start_after_end_is_400(gateway: GatewayProcess) -> None:
    async with httpx.AsyncClient(base_url=f"{gateway.url}/e2b", timeout=60,
                                 headers={"X-API-Key": gateway.keys["alpha"]}) as api:
        created = await api.post("/sandboxes", json={"templateID": "base"})
        sandbox_id = created.json()["sandboxID"]
        try:
            answer = await api.get(f"/sandboxes/{sandbox_id}/metrics",
                                   params={"start": 200, "end": 100})
            assert answer.status_code == 400
            assert "must not be after end" in answer.json()["message"]
        finally:
            await api.delete(f"/sandboxes/{sandbox_id}")
