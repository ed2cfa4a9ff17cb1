"""Load: 50 sessions of two tenants doing 50 executions each, at once, over HTTP and WebSocket.

Every execution prints a token unique to it; each of the 2,500 must come back in its own
execution of its own session (the answer, the streamed frames and the stored history), none
lost, none crossed. Meanwhile ``/healthz`` is timed every 50 ms; afterwards no container,
workspace, socket folder or mount of the deleted sessions may remain.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from websockets.asyncio.client import connect

from tests.conftest import GatewayProcess, containers_of, make_gateway

SESSIONS = 50
EXECUTIONS = 50
WS_WINDOW = 8
"""Executions a WebSocket session keeps in flight (the session queue holds 16)."""


def _token(sid: str, n: int) -> str:
    return f"tok-{sid[:8]}-{n:02d}-{secrets.token_hex(4)}"


async def _http_session(gateway: GatewayProcess, tenant: str, sid: str,
                        tokens: list[str]) -> None:
    async with httpx.AsyncClient(base_url=gateway.url, headers=gateway.headers(tenant),
                                 timeout=120) as client:
        for n, token in enumerate(tokens):
            answer = await client.post(f"/v1/sessions/{sid}/execute",
                                       json={"code": f"print('{token}')"})
            assert answer.status_code == 200, answer.text
            result = answer.json()
            assert result["status"] == "ok" and result["stdout"] == f"{token}\n", result
            assert result["execution_count"] == n + 1, result


async def _ws_session(gateway: GatewayProcess, tenant: str, sid: str,
                      tokens: list[str]) -> None:
    url = gateway.url.replace("http://", "ws://") + f"/v1/sessions/{sid}/ws"
    frames: dict[str, list[dict[str, Any]]] = {}
    ids = [f"{sid[:8]}-{n}-{secrets.token_hex(3)}" for n in range(len(tokens))]
    async with connect(url, additional_headers=gateway.headers(tenant), max_size=None) as ws:
        sent = done = 0
        while done < len(tokens):
            while sent < len(tokens) and sent - done < WS_WINDOW:
                await ws.send(json.dumps({"type": "execute", "id": ids[sent],
                                          "code": f"print('{tokens[sent]}')"}))
                sent += 1
            frame = json.loads(await asyncio.wait_for(ws.recv(), 120))
            assert frame["type"] != "rejected", frame
            frames.setdefault(frame["execution_id"], []).append(frame)
            if frame["type"] == "done":
                done += 1
    assert list(frames) == ids  # in order, and nothing from elsewhere
    for n, (execution_id, token) in enumerate(zip(ids, tokens, strict=True)):
        got = frames[execution_id]
        assert got[-1]["type"] == "done" and got[-1]["status"] == "ok", got
        assert got[-1]["execution_count"] == n + 1
        assert "".join(f["text"] for f in got if f["type"] == "stdout") == f"{token}\n", got


SAMPLER = """
import http.client, json, os, sys, time
connection = http.client.HTTPConnection('127.0.0.1', int(sys.argv[1]), timeout=30)
samples, wakeups = [], []
while not os.path.exists(sys.argv[2]):
    started = time.perf_counter()
    connection.request('GET', '/healthz')
    answer = connection.getresponse()
    answer.read()
    assert answer.status == 200
    samples.append((time.perf_counter() - started) * 1000)
    asleep = time.perf_counter()
    time.sleep(0.05)
    wakeups.append((time.perf_counter() - asleep - 0.05) * 1000)
print(json.dumps({'healthz': samples, 'wakeup': wakeups}))
"""


def _start_sampler(gateway: GatewayProcess, stop_file: Path) -> subprocess.Popen[str]:
    """/healthz timed from a process of its own, so the test's own busy event loop (50
    clients) does not count as the gateway's latency."""
    return subprocess.Popen([sys.executable, "-c", SAMPLER, gateway.url.rsplit(":", 1)[1],
                             str(stop_file)], stdout=subprocess.PIPE, text=True)


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def _summary(samples: list[float]) -> dict[str, float]:
    return {"n": len(samples), "p50": round(statistics.median(samples), 1),
            "p95": round(_percentile(samples, 0.95), 1), "max": round(max(samples), 1)}


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_load_every_output_lands_in_its_own_execution(
        docker_client: docker.DockerClient) -> None:
    gateway = make_gateway(max_kernels="60", memory="256m", min_idle="4", workspace_size="64m",
                           max_sessions_per_tenant="40",
                           max_concurrent_executions_per_tenant="400")
    gateway.start(timeout_s=300)
    report: dict[str, Any] = {}
    try:
        started = time.monotonic()
        tenants = ["alpha" if i % 2 == 0 else "beta" for i in range(SESSIONS)]
        gate = asyncio.Semaphore(8)

        async def create(tenant: str) -> str:
            async with gate, httpx.AsyncClient(base_url=gateway.url, timeout=300,
                                               headers=gateway.headers(tenant)) as client:
                answer = await client.post("/v1/sessions", json={})
                assert answer.status_code == 201, answer.text
                return str(answer.json()["id"])

        sids = await asyncio.gather(*(create(t) for t in tenants))
        report["create_s"] = round(time.monotonic() - started, 1)
        boxes = _sandboxes(gateway, sids)

        tokens = {sid: [_token(sid, n) for n in range(EXECUTIONS)] for sid in sids}
        stop_file = gateway.state_dir / "stop-sampler"
        sampler = _start_sampler(gateway, stop_file)
        started = time.monotonic()
        await asyncio.gather(*(
            (_ws_session if i % 4 in (1, 2) else _http_session)(gateway, tenant, sid,
                                                                tokens[sid])
            for i, (tenant, sid) in enumerate(zip(tenants, sids, strict=True))))
        report["run_s"] = round(time.monotonic() - started, 1)
        stop_file.touch()
        output, _ = await asyncio.to_thread(sampler.communicate, timeout=60)
        sampled: dict[str, list[float]] = json.loads(output)
        report["executions_per_s"] = round(SESSIONS * EXECUTIONS / report["run_s"], 1)
        report["healthz_ms"] = _summary(sampled["healthz"])
        # How late the sampler itself woke from its sleeps: the machine's own scheduling
        # delay for a process outside the gateway, to read the figure above against.
        report["sampler_wakeup_late_ms"] = _summary(sampled["wakeup"])

        # The stored history agrees: 50 executions per session, in order, each its own token.
        async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as client:
            for tenant, sid in zip(tenants, sids, strict=True):
                history = (await client.get(f"/v1/sessions/{sid}/executions",
                                            headers=gateway.headers(tenant))).json()
                stdout = [h["result"]["stdout"] for h in history]
                assert stdout == [f"{t}\n" for t in tokens[sid]], sid
                assert [h["seq"] for h in history] == sorted(h["seq"] for h in history)

            started = time.monotonic()
            deletions = await asyncio.gather(*(
                client.delete(f"/v1/sessions/{sid}", headers=gateway.headers(tenant))
                for tenant, sid in zip(tenants, sids, strict=True)))
            assert {d.status_code for d in deletions} == {204}
            report["delete_s"] = round(time.monotonic() - started, 1)

        # Nothing of the deleted sessions remains: containers, workspaces, socket folders.
        names = {f"replgate-{box['sandbox_id']}" for box in boxes}
        listed = docker_client.api.containers(
            all=True, filters={"label": f"io.replgate.owner={gateway.owner}"})
        left = [entry["Names"][0].lstrip("/") for entry in listed
                if entry["Names"][0].lstrip("/") in names]
        assert not left, left
        _assert_nothing_left(boxes)
        print(f"\nload: {json.dumps(report)}", file=sys.stderr)
        # The gateway, 50 kernels and this test's 50 clients share two cores at ~170
        # executions/s: /healthz measured p50 3-10 ms, p95 60-100 ms, the tail following the
        # machine's own scheduling delays (the sampler's late wake-ups), all reported. What is
        # asserted is only what no busy machine explains: an event loop held for seconds (a
        # blocking Docker, ZMQ or file call on it) shows as a /healthz answer that late.
        assert report["healthz_ms"]["max"] < 2000, json.dumps(report)
        assert report["healthz_ms"]["p50"] < 100, json.dumps(report)
    finally:
        gateway.stop()
        left_over = containers_of(docker_client, gateway.owner)
        for cid in left_over:
            docker_client.api.remove_container(cid, force=True)
        assert not left_over
        assert not list((gateway.state_dir / "workspaces").glob("*"))


def _assert_nothing_left(boxes: list[dict[str, Any]]) -> None:
    for box in boxes:
        assert not Path(box["workspace"]).exists()
        assert not Path(box["workspace"]).with_suffix(".ext4").exists()
        assert not Path(box["socket_dir"]).parent.exists()
    assert not [line for line in Path("/proc/self/mounts").read_text().splitlines()
                if any(box["sandbox_id"] in line for box in boxes)]


def _sandboxes(gateway: GatewayProcess, sids: list[str]) -> list[dict[str, Any]]:
    import sqlite3

    db = sqlite3.connect(f"file:{gateway.state_dir / 'replgate.db'}?mode=ro", uri=True)
    try:
        rows = dict(db.execute("SELECT id, sandbox FROM sessions").fetchall())
    finally:
        db.close()
    return [json.loads(rows[sid]) for sid in sids]
