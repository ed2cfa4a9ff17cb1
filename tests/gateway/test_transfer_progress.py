"""A pause's and a resume's progress on the sockets: ``transfer`` frames (real gateway, kernels)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import docker
import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect

from gateway.client import AsyncSandbox, TransferFrame
from tests.conftest import GatewayProcess, running_gateway

MiB = 2**20
HOLD_200_MIB = "import numpy as np\nbig = np.random.default_rng(7).random(200 * 2**20 // 8)\n"
"""Random floats: zstd cannot shrink them, so the stream moves all of their bytes."""


@pytest.fixture(scope="module")
def transfer_gateway(docker_client: docker.DockerClient) -> Iterator[GatewayProcess]:
    with running_gateway(docker_client, pause_with="variables") as process:
        yield process


@pytest.fixture
async def http(transfer_gateway: GatewayProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=transfer_gateway.url, timeout=180,
                                 headers=transfer_gateway.headers()) as client:
        yield client


@pytest.fixture
async def holding(http: httpx.AsyncClient) -> AsyncIterator[str]:
    """A session holding 200 MiB of variables."""
    answer = await http.post("/v1/sessions", json={})
    assert answer.status_code == 201, answer.text
    sid: str = answer.json()["id"]
    ran = await http.post(f"/v1/sessions/{sid}/execute",
                          json={"code": HOLD_200_MIB, "timeout_s": 120})
    assert ran.json()["status"] == "ok", ran.text
    yield sid
    await http.delete(f"/v1/sessions/{sid}")


def socket_url(gateway: GatewayProcess, sid: str, kind: str) -> str:
    return gateway.url.replace("http://", "ws://") + f"/v1/sessions/{sid}/{kind}"


async def transfers_until_end(ws: ClientConnection) -> list[dict[str, Any]]:
    """The ``transfer`` frames the socket sends, up to the one that ends the transfer."""
    frames = []
    async with asyncio.timeout(120):
        while True:
            frame = json.loads(await ws.recv())
            if frame["type"] == "transfer":
                frames.append(frame)
                if frame["state"] != "running":
                    return frames


def assert_progress(frames: list[dict[str, Any]], operation: str) -> None:
    """Frames of one transfer that advanced as it ran and ended with every byte moved."""
    assert {f["operation"] for f in frames} == {operation}, frames
    running, last = frames[:-1], frames[-1]
    assert running and all(f["state"] == "running" for f in running), frames
    done = [f["done_bytes"] for f in running]
    assert done == sorted(done), frames
    assert any(0 < f["done_bytes"] < f["total_bytes"] for f in running), frames
    assert last["state"] == "done" and last["done_bytes"] == last["total_bytes"], frames


async def test_a_pause_asked_over_http_streams_its_progress_to_both_sockets(
        transfer_gateway: GatewayProcess, http: httpx.AsyncClient, holding: str) -> None:
    headers = transfer_gateway.headers()
    async with connect(socket_url(transfer_gateway, holding, "ws"),
                       additional_headers=headers) as ws, \
            connect(socket_url(transfer_gateway, holding, "watch"),
                    additional_headers=headers) as watch:
        while json.loads(await watch.recv())["type"] != "history_end":
            pass
        on_ws = asyncio.ensure_future(transfers_until_end(ws))
        on_watch = asyncio.ensure_future(transfers_until_end(watch))
        paused = await http.post(f"/v1/sessions/{holding}/pause")
        assert paused.status_code == 200 and paused.json()["status"] == "paused", paused.text
        assert paused.json()["transfer"] is None  # shown while it runs only
        frames, watched = await on_ws, await on_watch
    assert_progress(frames, "pause")
    assert frames[-1]["total_bytes"] >= 200 * MiB, frames[-1]
    assert all(f["execution_id"] is None for f in frames)
    assert watched == frames  # both sockets are told the same


async def test_an_execute_on_a_paused_session_streams_the_resume_before_its_output(
        transfer_gateway: GatewayProcess, http: httpx.AsyncClient, holding: str) -> None:
    paused = await http.post(f"/v1/sessions/{holding}/pause")
    assert paused.json()["status"] == "paused", paused.text
    async with connect(socket_url(transfer_gateway, holding, "ws"),
                       additional_headers=transfer_gateway.headers()) as ws:
        await ws.send(json.dumps({"type": "execute", "id": "after-pause",
                                  "code": "print(big.nbytes // 2**20)", "timeout_s": 120}))
        frames: list[dict[str, Any]] = []
        async with asyncio.timeout(180):
            while not frames or frames[-1]["type"] != "done":
                frames.append(json.loads(await ws.recv()))
    kinds = [f["type"] for f in frames]
    first_output = kinds.index("stdout")
    assert set(kinds[:first_output]) == {"transfer"} and "transfer" not in kinds[first_output:]
    assert_progress(frames[:first_output], "resume")
    assert all(f["execution_id"] == "after-pause" for f in frames)
    assert "".join(f["text"] for f in frames if f["type"] == "stdout") == "200\n"
    assert frames[-1]["status"] == "ok" and not frames[-1]["restarted"]


async def test_the_client_passes_a_resumes_progress_to_on_transfer(
        transfer_gateway: GatewayProcess, http: httpx.AsyncClient, holding: str) -> None:
    paused = await http.post(f"/v1/sessions/{holding}/pause")
    assert paused.json()["status"] == "paused", paused.text
    seen: list[TransferFrame] = []
    async with await AsyncSandbox.connect(holding, base_url=transfer_gateway.url,
                                          api_key=transfer_gateway.keys["alpha"]) as sandbox:
        ran = await sandbox.run_code("print(big.size)", on_transfer=seen.append, timeout=120)
    assert ran.status == "ok" and ran.stdout == f"{200 * MiB // 8}\n", ran
    assert seen and {t.operation for t in seen} == {"resume"}
    assert seen[-1].state == "done" and seen[-1].done_bytes == seen[-1].total_bytes > 0


async def test_a_refused_pause_ends_its_transfer_failed_and_the_session_runs_on(
        docker_client: docker.DockerClient) -> None:
    # Filled to within a few MiB of its limit, the sandbox has no room for a snapshot: the
    # pause is refused, its transfer says it failed, and every variable is still there.
    fill = ("import numpy as np\nfrom replgate_kernel.snapshot import memory_free\n"
            "chunks = []\nwhile memory_free() > 12 * 2**20:\n"
            "    chunks.append(np.ones(2**20 // 8))\nkept = len(chunks)\n")
    with running_gateway(docker_client, pause_with="variables", memory="512m") as process:
        async with httpx.AsyncClient(base_url=process.url, timeout=180,
                                     headers=process.headers()) as client:
            sid = (await client.post("/v1/sessions", json={})).json()["id"]
            filled = await client.post(f"/v1/sessions/{sid}/execute",
                                       json={"code": fill, "timeout_s": 120})
            assert filled.json()["status"] == "ok", filled.text
            async with connect(socket_url(process, sid, "ws"),
                               additional_headers=process.headers()) as ws:
                told = asyncio.ensure_future(transfers_until_end(ws))
                refused = await client.post(f"/v1/sessions/{sid}/pause")
                frames = await told
            assert refused.status_code == 409, refused.text
            assert frames[-1]["state"] == "failed" and frames[-1]["operation"] == "pause"
            after = await client.post(f"/v1/sessions/{sid}/execute",
                                      json={"code": "print(len(chunks) == kept)"})
            assert after.json()["stdout"] == "True\n", after.text
            await client.delete(f"/v1/sessions/{sid}")
