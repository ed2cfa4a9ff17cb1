"""Paused sessions in shared storage: two nodes and two gateways (processes of their own, own
state directories, sharing no file) on a real PostgreSQL and a real S3 server (SeaweedFS), over
mutual TLS. A session paused on one node resumes on the other, through a gateway, with its
variables and its files, after a drain and after a kill -9."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import docker
import httpx
import psycopg
import pytest
from cluster_support import (
    ADMIN_KEY,
    NODE_TIMEOUT_S,
    Cluster,
    execute,
    gateway_client,
    running_cluster,
)

from bench.cycles import CycledSession, fork_chain
from tests.conftest import GatewayProcess
from tests.kernel_pool.bundles.seaweed_support import BUCKET, running_seaweedfs

FILE = "data/notes.txt"


@pytest.fixture(scope="module")
def cluster(docker_client: docker.DockerClient) -> Iterator[Cluster]:
    with running_seaweedfs() as seaweed, running_cluster(
            docker_client, nodes=2, bundle_store=f"s3://{BUCKET}/{secrets.token_hex(6)}",
            store_env=seaweed.aws_env()) as started:
        yield started


async def _session(client: httpx.AsyncClient, code: str) -> tuple[str, str]:
    """A new session that ran ``code`` and holds :data:`FILE`; its id and its node."""
    created = await client.post("/v1/sessions", json={})
    assert created.status_code == 201, created.text
    sid, node = created.json()["id"], created.json()["node"]
    put = await client.put(f"/v1/sessions/{sid}/files/{FILE}", content=f"of {sid}".encode())
    assert put.status_code in (200, 201), put.text
    assert (await execute(client, sid, code))["status"] == "ok"
    return sid, node


async def _pause(client: httpx.AsyncClient, sid: str) -> None:
    paused = await client.post(f"/v1/sessions/{sid}/pause")
    assert paused.status_code == 200 and paused.json()["status"] == "paused", paused.text


@asynccontextmanager
async def _operator(gateway: GatewayProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60,
                                 headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as ops:
        yield ops


async def _beside(client: httpx.AsyncClient, ops: httpx.AsyncClient, cluster: Cluster,
                  node: str, code: str) -> str:
    """A new session on ``node`` (the other drained meanwhile) that ran ``code``; its id."""
    other = next(n.node_id for n in cluster.nodes if n.node_id != node)
    await ops.post(f"/v1/nodes/{other}/drain")
    try:
        sid, placed = await _session(client, code)
    finally:
        await ops.post(f"/v1/nodes/{other}/undrain")
    assert placed == node
    return sid


async def _held(ops: httpx.AsyncClient, node: str) -> int:
    """The sessions ``node`` holds, as ``GET /v1/nodes`` says."""
    held: int = next(n for n in (await ops.get("/v1/nodes")).json()
                     if n["id"] == node)["sessions"]
    return held


async def _status(client: httpx.AsyncClient, sid: str) -> str:
    status: str = (await client.get(f"/v1/sessions/{sid}")).json()["status"]
    return status


async def test_a_drained_node_sessions_resume_on_the_other_with_everything(
        cluster: Cluster) -> None:
    one, two = cluster.gateways
    async with gateway_client(one) as first, gateway_client(two, key_of=one) as second, \
            _operator(two) as ops:
        paused, node = await _session(first, "x = 41")
        await _pause(first, paused)
        # A session still running on the node when it is drained: the drain pauses it.
        running = await _beside(first, ops, cluster, node, "y = 'kept'")
        drained = await ops.post(f"/v1/nodes/{node}/drain")
        assert drained.status_code == 202, drained.text
        try:
            async with asyncio.timeout(60):
                while await _status(second, running) != "paused":  # noqa: ASYNC110
                    await asyncio.sleep(0.2)
            # Through the other gateway: each resumes on the other node, as it was.
            result = await execute(second, paused, "x + 1")
            assert result["outputs"][-1]["data"]["text/plain"] == "42"
            assert result["restarted"] is False, result
            result = await execute(second, running, f"print(y, open({FILE!r}).read())")
            assert result["stdout"] == f"kept of {running}\n" and not result["restarted"]
            for sid in (paused, running):
                now = (await second.get(f"/v1/sessions/{sid}")).json()
                assert now["node"] not in (None, node), now
                got = await first.get(f"/v1/sessions/{sid}/files/{FILE}")
                assert got.content == f"of {sid}".encode()
            # Nothing of them is left on the drained node: its copies were removed.
            async with asyncio.timeout(2 * NODE_TIMEOUT_S):
                while await _held(ops, node):  # noqa: ASYNC110
                    await asyncio.sleep(0.2)
        finally:
            await ops.post(f"/v1/nodes/{node}/undrain")
            for sid in (paused, running):
                await first.delete(f"/v1/sessions/{sid}")


async def test_a_network_policy_moves_with_its_session_and_the_new_node_applies_it(
        cluster: Cluster) -> None:
    one, _two = cluster.gateways
    policy = {"default": "deny", "allow": [], "deny": ["198.51.100.0/24"]}
    fetch = ("import requests\n"
             "print(requests.get('http://198.51.100.7/', timeout=10).text.strip())")
    async with gateway_client(one) as first, _operator(one) as ops:
        sid, node = await _session(first, "x = 1")
        assert (await first.patch(f"/v1/sessions/{sid}/network", json=policy)).status_code == 200
        await _pause(first, sid)
        assert (await ops.post(f"/v1/nodes/{node}/drain")).status_code == 202
        try:
            result = await execute(first, sid, fetch)  # resumed on the other node
            assert (await first.get(f"/v1/sessions/{sid}")).json()["node"] not in (None, node)
            assert result["stdout"].startswith("replgate egress refused 198.51.100.7:80"), result
            assert (await first.get(f"/v1/sessions/{sid}/network")).json() == {
                **policy, "rules": []}  # (a policy's answer names its secret rules, none here)
            log = (await first.get(f"/v1/sessions/{sid}/egress")).json()
            assert "denied by '198.51.100.0/24'" in log[-1]["reason"], log
        finally:
            await ops.post(f"/v1/nodes/{node}/undrain")
            await first.delete(f"/v1/sessions/{sid}")


async def test_a_killed_node_sessions_resume_from_their_last_pause(cluster: Cluster) -> None:
    one = cluster.gateways[0]
    async with gateway_client(one) as first, _operator(one) as ops:
        paused, node = await _session(first, "x = 41")
        other = next(n.node_id for n in cluster.nodes if n.node_id != node)
        ran_on = await _beside(first, ops, cluster, node, "z = 1")
        await _pause(first, paused)
        await _pause(first, ran_on)
        await execute(first, ran_on, "z = 2")  # resumed: it runs on past its last pause
        lost = next(n for n in cluster.nodes if n.node_id == node)
        lost.stop(signal.SIGKILL)
        try:
            await asyncio.sleep(NODE_TIMEOUT_S * 2)  # declared down by a gateway's watch
            # Paused when its node was lost: everything kept, nothing restarted.
            result = await execute(first, paused, "x + 1")
            assert result["outputs"][-1]["data"]["text/plain"] == "42"
            assert result["restarted"] is False, result
            # Running: back to its last pause, and its next execution says so.
            result = await execute(first, ran_on, f"print(z, open({FILE!r}).read())")
            assert result["restarted"] is True and "lost" in (result["reason"] or ""), result
            assert "last pause" in result["reason"]
            assert result["stdout"] == f"1 of {ran_on}\n"
            for sid in (paused, ran_on):
                now = (await first.get(f"/v1/sessions/{sid}")).json()
                assert now["node"] == other, now
        finally:
            for sid in (paused, ran_on):
                await first.delete(f"/v1/sessions/{sid}")
            lost.start()
            lost.wait_registered(cluster.database_url)


async def test_a_snapshot_taken_on_one_node_makes_sessions_on_the_other(
        cluster: Cluster) -> None:
    one, two = cluster.gateways
    async with gateway_client(one) as first, gateway_client(two, key_of=one) as second, \
            _operator(two) as ops:
        source, node = await _session(first, "x = 41")
        saved = await first.post(f"/v1/sessions/{source}/snapshots",
                                 json={"name": "across-nodes"})
        assert saved.status_code == 201, saved.text
        snapshot = saved.json()["id"]
        copies: list[str] = []
        await ops.post(f"/v1/nodes/{node}/drain")  # the copy goes to the other node
        try:
            # Through the other gateway, by name: its record is in the shared database, its
            # bundle in the S3 store.
            assert [s["id"] for s in (await second.get("/v1/snapshots")).json()] == [snapshot]
            made = await second.post("/v1/snapshots/across-nodes/sessions")
            assert made.status_code == 201, made.text
            copies.append(made.json()["id"])
            result = await execute(second, copies[0], f"print(x + 1, open({FILE!r}).read())")
            assert result["stdout"] == f"42 of {source}\n", result
            now = (await first.get(f"/v1/sessions/{copies[0]}")).json()
            assert now["node"] not in (None, node), now
            # Deleted through the other gateway, while its copy and source go on.
            assert (await second.delete(f"/v1/snapshots/{snapshot}")).status_code == 204
            assert (await first.get("/v1/snapshots")).json() == []
            gone = await first.post(f"/v1/snapshots/{snapshot}/sessions")
            assert gone.status_code == 404, gone.text
            assert (await execute(first, copies[0], "print(x)"))["stdout"] == "41\n"
            assert (await execute(first, source, "print(x)"))["stdout"] == "41\n"
        finally:
            await ops.post(f"/v1/nodes/{node}/undrain")
            for sid in (source, *copies):
                await first.delete(f"/v1/sessions/{sid}")


CYCLES = int(os.environ.get("REPLGATE_TEST_CYCLES", "4"))
"""Pause/resume cycles across the nodes (the issue's 100 by hand: tests/gateway/test_cycles.py)."""
FORK_CHAIN = int(os.environ.get("REPLGATE_TEST_FORK_CHAIN", "2"))


async def test_cycles_across_the_nodes_keep_everything_every_time(cluster: Cluster) -> None:
    """Cycles of ``bench/cycles.py``'s checks through a node: each variables pause resumed on
    the other node (its node drained while it is paused), the variables and every workspace
    file, open or not, as they were; each memory pause resumed on its node (its image stays
    there), the /tmp file and the positions too. Then a chain of forks of forks, each checked
    against its parent."""
    one, two = cluster.gateways
    async with gateway_client(one) as first, _operator(two) as ops:
        created = await first.post("/v1/sessions", json={})
        assert created.status_code == 201, created.text
        session = CycledSession(first, created.json()["id"])
        node = created.json()["node"]

        async def drain(paused: CycledSession) -> None:
            drained = await ops.post(f"/v1/nodes/{node}/drain")
            assert drained.status_code == 202, drained.text
            # Until the session's gateway (not the operator's) knows of the drain: a request
            # then moves the paused session, and its answer is the other node's (what the
            # bundle kept). Before, it is the drained node's, and a resume moves it after.
            async with asyncio.timeout(30):
                while (await first.get(f"/v1/sessions/{paused.sid}")).json()["node"] == node:  # noqa: ASYNC110
                    await asyncio.sleep(0.1)

        try:
            await session.setup()
            for i in range(CYCLES):
                memory = i % 2 == 1
                if memory:  # its image stays on its node: resumed there, all of it kept
                    done = await session.cycle(i, memory)
                    assert (done.node, done.paused_with, done.not_kept) == (node, "memory", [])
                    continue
                try:
                    done = await session.cycle(i, memory, move=drain)
                finally:
                    await ops.post(f"/v1/nodes/{node}/undrain")
                assert done.node not in (None, node) and done.not_kept == [], done
                node = done.node
            await session.step(CYCLES, memory=False)
            await fork_chain(session, FORK_CHAIN, CYCLES + 1,
                             lambda sid: first.delete(f"/v1/sessions/{sid}"))
            await session.check()
        finally:
            await first.delete(f"/v1/sessions/{session.sid}")


LOSS_ROUNDS = int(os.environ.get("REPLGATE_TEST_LOSS_ROUNDS", "6"))
"""Rounds of node loss (each about 35 s here: a kill, its detection, two restores, the node's
restart); the issue's 20 by hand with ``REPLGATE_TEST_LOSS_ROUNDS=20``. Before notices on
node states, a round failed about one time in four."""


def _node_state(database_url: str, node_id: str) -> str:
    with psycopg.connect(database_url, autocommit=True) as db:
        row = db.execute("SELECT state FROM nodes WHERE id = %s", (node_id,)).fetchone()
    return str(row[0]) if row else "missing"


async def test_the_first_request_after_a_node_is_down_never_goes_to_it(cluster: Cluster) -> None:
    """Node loss, every time: a node killed round after round (each in turn), and the first
    requests sent the moment the database says it is down, through either gateway."""
    one, two = cluster.gateways
    async with gateway_client(one) as first, gateway_client(two, key_of=one) as second, \
            _operator(one) as ops:
        for round_ in range(LOSS_ROUNDS):
            lost = cluster.nodes[round_ % 2]
            # (each gateway answers one of the two first requests, in turn)
            by_paused, by_running = (first, second) if round_ % 2 else (second, first)
            paused = await _beside(first, ops, cluster, lost.node_id, f"x = {round_}")
            running = await _beside(first, ops, cluster, lost.node_id, f"z = {round_}")
            await _pause(first, paused)
            await _pause(first, running)
            await execute(first, running, "z = -1")  # resumed: it runs on past its last pause
            lost.stop(signal.SIGKILL)
            try:
                async with asyncio.timeout(10 * NODE_TIMEOUT_S):
                    while await asyncio.to_thread(  # noqa: ASYNC110
                            _node_state, cluster.database_url, lost.node_id) != "down":
                        await asyncio.sleep(0.05)
                result = await execute(by_paused, paused, "x + 1")
                assert result["status"] == "ok" and result["restarted"] is False, (
                    round_, result)
                assert result["outputs"][-1]["data"]["text/plain"] == str(round_ + 1)
                result = await execute(by_running, running, "print(z)")
                assert result["status"] == "ok" and result["restarted"] is True, (
                    round_, result)
                assert result["stdout"] == f"{round_}\n" and "lost" in result["reason"]
            finally:
                for sid in (paused, running):
                    await first.delete(f"/v1/sessions/{sid}")
                lost.start()
                lost.wait_registered(cluster.database_url)

