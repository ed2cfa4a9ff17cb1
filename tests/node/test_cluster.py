"""Many machines on one: three nodes and two gateways (separate processes, own state
directories) on a real PostgreSQL, over TCP with mutual TLS only (see cluster_support)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from cluster_support import (
    ADMIN_KEY,
    NODE_TIMEOUT_S,
    Cluster,
    create_session,
    execute,
    gateway_client,
    make_node,
    running_cluster,
)
from websockets.asyncio.client import connect

from node.tls import client_context, make_cluster_certs
from tests.conftest import REPO


@pytest.fixture(scope="module")
def cluster(docker_client: docker.DockerClient) -> Iterator[Cluster]:
    with running_cluster(docker_client) as started:
        yield started


async def test_sessions_spread_over_the_nodes_and_any_gateway_serves_any(
        cluster: Cluster) -> None:
    one, two = cluster.gateways
    async with gateway_client(one) as first, gateway_client(two, key_of=one) as second:
        created = [await create_session(first) for _ in range(3)]
        try:
            placed = {s["node"] for s in created}
            assert placed == {n.node_id for n in cluster.nodes}, \
                "each new session went to the node with the most room"
            sid = created[0]["id"]
            assert (await execute(first, sid, "x = 41"))["status"] == "ok"
            # The other gateway never saw this session: it finds it in the database.
            result = await execute(second, sid, "x + 1")
            assert result["outputs"][-1]["data"]["text/plain"] == "42"
            seen = (await second.get(f"/v1/sessions/{sid}")).json()
            assert seen["node"] == created[0]["node"] and seen["execution_count"] == 2
            history = (await second.get(f"/v1/sessions/{sid}/executions")).json()
            assert [h["code"] for h in history] == ["x = 41", "x + 1"]
            listed = {s["id"] for s in (await second.get("/v1/sessions")).json()}
            assert {s["id"] for s in created} <= listed
            # Another tenant's key finds none of them, through either gateway.
            other = await second.get(f"/v1/sessions/{sid}", headers=two.headers("beta"))
            assert other.status_code == 404
        finally:
            for session in created:
                await second.delete(f"/v1/sessions/{session['id']}")
        gone = await first.get(f"/v1/sessions/{created[1]['id']}")
        assert gone.status_code == 404, "deleted through one gateway is gone through the other"


async def test_websocket_and_files_through_another_gateway(cluster: Cluster) -> None:
    one, two = cluster.gateways
    async with gateway_client(one) as first, gateway_client(two, key_of=one) as second:
        sid = (await create_session(first))["id"]
        try:
            put = await second.put(f"/v1/sessions/{sid}/files/data.csv", content=b"a,b\n1,2\n")
            assert put.status_code in (200, 201), put.text
            url = two.url.replace("http://", "ws://") + f"/v1/sessions/{sid}/ws"
            async with connect(url, additional_headers=one.headers()) as ws:
                code = ("import time\nprint(open('data.csv').read().split()[1], flush=True)\n"
                        "time.sleep(1)\nprint('later')")
                await ws.send(json.dumps({"type": "execute", "code": code, "id": "ws-1"}))
                frames: list[dict[str, Any]] = []
                async with asyncio.timeout(60):
                    while not frames or frames[-1]["type"] != "done":
                        frame = json.loads(await ws.recv())
                        if frame.get("execution_id") == "ws-1":
                            frames.append(frame)
            assert frames[0]["type"] == "stdout" and frames[0]["text"] == "1,2\n"
            assert frames[-1]["status"] == "ok"
            got = await first.get(f"/v1/sessions/{sid}/files/data.csv")
            assert got.content == b"a,b\n1,2\n"
        finally:
            await first.delete(f"/v1/sessions/{sid}")


def test_a_node_refuses_a_client_of_another_ca(cluster: Cluster) -> None:
    strangers = make_cluster_certs(Path(tempfile.mkdtemp(prefix="rg-strangers-", dir="/tmp")))
    node = cluster.nodes[0]
    ours = client_context(cluster.certs.gateway_cert, cluster.certs.gateway_key,
                          cluster.certs.ca)
    answer = httpx.get(f"https://{node.address}/healthz", verify=ours)
    assert answer.status_code == 200 and answer.json()["node"] == node.node_id
    # A certificate of another CA: the node's handshake refuses it.
    theirs = client_context(strangers.gateway_cert, strangers.gateway_key, cluster.certs.ca)
    with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
        httpx.get(f"https://{node.address}/healthz", verify=theirs)
    # No certificate at all: refused too.
    bare = ssl.create_default_context(cafile=str(cluster.certs.ca))
    with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
        httpx.get(f"https://{node.address}/healthz", verify=bare)


def test_a_node_started_with_a_live_nodes_id_is_refused_and_says_so(cluster: Cluster) -> None:
    live = cluster.nodes[0]
    twin = make_node(live.node_id, cluster.database_url, cluster.certs)
    twin.start()
    try:
        assert twin.process is not None and twin.process.wait(timeout=120) == 2, twin.log()
    finally:
        twin.stop()
    assert (f"node id {live.node_id!r} is held by a live node at {live.address}"
            in twin.log())
    answer = httpx.get(f"https://{live.address}/healthz", verify=client_context(
        cluster.certs.gateway_cert, cluster.certs.gateway_key, cluster.certs.ca))
    assert answer.json()["node"] == live.node_id


async def test_a_gateway_killed_mid_stream_loses_nothing(cluster: Cluster) -> None:
    one, two = cluster.gateways
    async with gateway_client(two, key_of=one) as second:
        sid = (await create_session(second))["id"]
        try:
            async with gateway_client(one) as first:
                running = asyncio.ensure_future(first.post(
                    f"/v1/sessions/{sid}/execute",
                    json={"code": "import time\ntime.sleep(2)\ny = 'done'"}))
                await asyncio.sleep(0.8)
                one.stop(signal.SIGKILL)
                with pytest.raises(httpx.HTTPError):
                    await running
            # The node ran it to its end: the other gateway sees its effect.
            await asyncio.sleep(2)
            result = await execute(second, sid, "print(y)")
            assert result["stdout"] == "done\n"
        finally:
            await second.delete(f"/v1/sessions/{sid}")
            one.start()  # back for the tests after this one


async def test_a_lost_node_sessions_start_again_elsewhere_saying_so(cluster: Cluster) -> None:
    one = cluster.gateways[0]
    async with gateway_client(one) as first:
        sid = (await create_session(first))["id"]
        await execute(first, sid, "z = 1")
        placed = (await first.get(f"/v1/sessions/{sid}")).json()["node"]
        lost = next(n for n in cluster.nodes if n.node_id == placed)
        lost.stop(signal.SIGKILL)
        try:
            await asyncio.sleep(NODE_TIMEOUT_S * 2)  # declared down by a gateway's watch
            result = await execute(first, sid, "'z' in dir()")
            assert result["restarted"] is True and "lost" in (result["reason"] or "")
            assert result["outputs"][-1]["data"]["text/plain"] == "False"
            now = (await first.get(f"/v1/sessions/{sid}")).json()
            assert now["node"] != lost.node_id
        finally:
            await first.delete(f"/v1/sessions/{sid}")
            lost.start()
            lost.wait_registered(cluster.database_url)


def test_the_audit_chain_written_by_both_gateways_verifies(cluster: Cluster) -> None:
    env = {**os.environ, "REPLGATE_DATABASE_URL": cluster.database_url}
    done = subprocess.run([sys.executable, "-m", "gateway.cli", "audit", "verify"], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("ok: ") and int(done.stdout.split()[1]) >= 4



async def test_operators_see_and_drain_the_nodes(cluster: Cluster) -> None:
    one, two = cluster.gateways
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with gateway_client(one) as first, httpx.AsyncClient(base_url=two.url, headers=admin,
                                                        timeout=60) as ops:
        nodes = (await ops.get("/v1/nodes")).json()
        assert {n["id"] for n in nodes} == {n.node_id for n in cluster.nodes}
        assert all(n["state"] == "up" and n["max_kernels"] == 4 for n in nodes)
        # Every node up counts, reached by this gateway yet or not (it said 0 at first).
        for gateway in cluster.gateways:
            health = (await ops.get(f"{gateway.url}/healthz")).json()
            assert health["pool"]["nodes"] == len(cluster.nodes), health
        assert (await first.get("/v1/nodes")).status_code == 403, "a tenant's key is refused"
        assert (await ops.get("/v1/nodes", headers={"Authorization": ""})).status_code == 401
        assert (await ops.post("/v1/nodes/nope/drain")).status_code == 404
        drained = cluster.nodes[2].node_id
        answer = await ops.post(f"/v1/nodes/{drained}/drain")
        assert answer.status_code == 202 and answer.json()["state"] == "draining"
        try:
            created = [await create_session(first) for _ in range(4)]
            assert drained not in {s["node"] for s in created}, "no new session on a drained node"
            for session in created:
                await first.delete(f"/v1/sessions/{session['id']}")
        finally:
            back = await ops.post(f"/v1/nodes/{drained}/undrain")
        assert back.status_code == 200 and back.json()["state"] == "up"
        metrics = await first.get("/metrics")
        assert metrics.status_code == 200 and "replgate_sessions " in metrics.text


async def test_postgresql_restarted_under_load_loses_nothing(cluster: Cluster) -> None:
    one, two = cluster.gateways
    async with gateway_client(one) as first, gateway_client(two, key_of=one) as second:
        sids = [(await create_session(first))["id"] for _ in range(2)]
        answered: dict[str, list[int]] = {sid: [] for sid in sids}
        statuses: list[int] = []
        stop = asyncio.Event()

        async def load(client: httpx.AsyncClient, sid: str) -> None:
            index = 0
            while not stop.is_set():
                index += 1
                try:
                    answer = await client.post(f"/v1/sessions/{sid}/execute",
                                               json={"code": f"n = {index}"})
                except httpx.HTTPError:
                    continue
                statuses.append(answer.status_code)
                if answer.status_code == 200:
                    answered[sid].append(index)
                await asyncio.sleep(0.05)

        workers = [asyncio.create_task(load(client, sid))
                   for client, sid in ((first, sids[0]), (second, sids[1]))]
        try:
            await asyncio.sleep(1)
            restart = await asyncio.create_subprocess_exec(
                "pg_ctlcluster", *_postgres_cluster(), "restart")
            assert await restart.wait() == 0
            await asyncio.sleep(3)
        finally:
            stop.set()
            await asyncio.gather(*workers)
        try:
            assert set(statuses) <= {200, 503}, f"only 503 while the database was away: {statuses}"
            for sid in sids:
                result = await execute(second, sid, "n")
                assert result["status"] == "ok"
                history = (await first.get(f"/v1/sessions/{sid}/executions")).json()
                recorded = {h["code"] for h in history if h["status"] == "ok"}
                missing = [i for i in answered[sid] if f"n = {i}" not in recorded]
                assert not missing, f"answered 200 but not in the history: {missing}"
            assert len([s for s in statuses if s == 200]) > 10
        finally:
            for sid in sids:
                await first.delete(f"/v1/sessions/{sid}")


def _postgres_cluster() -> list[str]:
    """The version and name of the local PostgreSQL cluster the tests use."""
    listed = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True, check=True)
    version, name = listed.stdout.split()[:2]
    return [version, name]
