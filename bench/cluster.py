"""What the hops of many machines cost, on one machine: a one-process gateway beside a local
cluster (``replgate cluster``: nodes and gateways over mutual TLS, on PostgreSQL).

    python -m bench.cluster [--n 300] [--clients 6] [--seconds 15] [--rounds 3] [--warmup 3]

Printed, side by side in one run (targets from the issue "Many machines"):

- ``1+1`` over HTTP through a gateway whose session runs on a node, against the one-process
  gateway on the same PostgreSQL: p50 difference (target <= 1.5 ms);
- a session's creation in cluster mode, warm kernels on the nodes: p50 (target <= 15 ms);
- throughput of ``1+1`` recorded (answered, then in the audit chain) with ``--clients``
  clients spread over the cluster's two gateways and three nodes, against the same clients
  on the one-process gateway (target >= 0.8x; one machine shows what the hops cost, not
  scaling). Each side warms up for ``--warmup`` seconds, then ``--rounds`` windows of each
  alternate (the cluster first in odd rounds, second in even ones), so a drift of the
  machine's speed over the run weighs on both alike; the ratio is of the totals. A window
  ends when its executions are all in the audit chain: a gateway answers an execution before
  it records it, and one that falls behind under load records the rest after.

The database is a new one in the PostgreSQL of ``REPLGATE_TEST_POSTGRES`` (``./run.sh test``
and ``./run.sh cluster`` start it), dropped afterwards. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg

from bench._measure import interleaved, summary
from bench._peers import Replgate
from node.local import LocalCluster
from tests.conftest import create_database, drop_database, free_port

CODE = "1+1"
RECORDED_WITHIN_S = 60
"""How long after a throughput window its executions may take to be in the audit chain."""


async def _execute(client: httpx.AsyncClient, sid: str) -> None:
    answer = await client.post(f"/v1/sessions/{sid}/execute", json={"code": CODE})
    answer.raise_for_status()


async def _audited(db: psycopg.AsyncConnection[Any]) -> int:
    """How many records the database's audit chain holds."""
    row = await (await db.execute("SELECT seq FROM audit_head WHERE id = 1")).fetchone()
    return 0 if row is None else int(row[0])


async def _throughput(targets: list[tuple[httpx.AsyncClient, str]], seconds: float,
                      database_url: str) -> tuple[float, float]:
    """Executions per second with one client per target, each running ``1+1`` back to back,
    until each is in the audit chain: a gateway answers an execution before it records it
    (history, audit), and one that falls behind under the load records the rest after it.
    Executions per second answered, and recorded."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as db:
        return await _window(targets, seconds, db)


async def _window(targets: list[tuple[httpx.AsyncClient, str]], seconds: float,
                  db: psycopg.AsyncConnection[Any]) -> tuple[float, float]:
    recorded = await _audited(db)
    done = 0
    stop = time.monotonic() + seconds

    async def client(http: httpx.AsyncClient, sid: str) -> None:
        nonlocal done
        while time.monotonic() < stop:
            await _execute(http, sid)
            done += 1

    started = time.monotonic()
    await asyncio.gather(*(client(http, sid) for http, sid in targets))
    answered = done / (time.monotonic() - started)
    while await _audited(db) < recorded + done:
        if time.monotonic() - started > seconds + RECORDED_WITHIN_S:
            raise RuntimeError(f"{recorded + done - await _audited(db)} executions "
                               f"answered but not in the audit chain {RECORDED_WITHIN_S} s after")
        await asyncio.sleep(0.01)
    return answered, done / (time.monotonic() - started)


async def main(n: int, clients: int, seconds: float, rounds: int, warmup: float) -> None:
    database_url = create_database()
    folder = Path(tempfile.mkdtemp(prefix="rg-bench-cluster-", dir="/tmp"))
    cluster = LocalCluster(folder, database_url, nodes=3, gateways=2,
                           gateway_port=free_port(), node_port=free_port(),
                           env={"REPLGATE_MIN_IDLE": "2", "REPLGATE_MAX_KERNELS": "6",
                                "REPLGATE_WORKSPACE_SIZE": "64m", "REPLGATE_LOG_LEVEL": "warning",
                                "REPLGATE_KEEP_SESSIONS_ON_STOP": "false",
                                "REPLGATE_MAX_SESSIONS_PER_TENANT": "256",
                                "REPLGATE_MAX_CONCURRENT_EXECUTIONS_PER_TENANT": "256"},
                           name=f"bench-{secrets.token_hex(3)}-")
    # The same database for both sides: what differs is the hop, not SQLite against PostgreSQL.
    alone_database = create_database()
    alone = Replgate(min_idle=clients, max_kernels=clients + 2,
                     settings={"REPLGATE_DATABASE_URL": alone_database,
                               "REPLGATE_LOCAL_NODE": "true"})
    headers = {"Authorization": f"Bearer {cluster.api_key}"}
    try:
        await asyncio.to_thread(cluster.start)
        await alone.wait_idle(clients)
        gateways = [httpx.AsyncClient(base_url=url, headers=headers, timeout=120)
                    for url in cluster.urls]
        try:
            # Session creation on warm nodes (each deleted at once, so kernels stay warm), after
            # one per node not counted: a gateway's first reaches a node and the database on
            # connections it has yet to make (the hop below is measured after a warm-up too).
            for gateway in itertools.islice(itertools.cycle(gateways), 3):
                warm = await gateway.post("/v1/sessions", json={})
                warm.raise_for_status()
                await gateway.delete(f"/v1/sessions/{warm.json()['id']}")
                await asyncio.sleep(0.5)
            created: list[float] = []
            for gateway in itertools.islice(itertools.cycle(gateways), 20):
                start = time.perf_counter()
                answer = await gateway.post("/v1/sessions", json={})
                created.append((time.perf_counter() - start) * 1000)
                answer.raise_for_status()
                await gateway.delete(f"/v1/sessions/{answer.json()['id']}")
                await asyncio.sleep(0.5)  # the node's refill
            # 1+1 through a node, against in process, interleaved.
            remote = (await gateways[0].post("/v1/sessions", json={})).json()["id"]
            local = await alone.create_session()

            async def through_node() -> None:
                await _execute(gateways[0], remote)

            async def in_process() -> None:
                await alone.http_execute(local, CODE)

            times = await interleaved({"through a node (TLS)": through_node,
                                       "in process": in_process}, n, warmup=30, rounds=10)
            # Throughput: the same clients, on the cluster and on the one-process gateway.
            spread = []
            for index in range(clients):
                gateway = gateways[index % len(gateways)]
                spread.append((gateway, (await gateway.post("/v1/sessions",
                                                            json={})).json()["id"]))
            single = [(alone.http, await alone.create_session()) for _ in range(clients)]
            sides = {"cluster": (spread, database_url), "one process": (single, alone_database)}
            for targets, database in sides.values():
                await _throughput(targets, warmup, database)
            rates: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
            for round_ in range(rounds):
                order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
                for name in order:
                    targets, database = sides[name]
                    rates[name].append(await _throughput(targets, seconds / rounds, database))
        finally:
            for gateway in gateways:
                await gateway.aclose()
    finally:
        await alone.stop()
        await asyncio.to_thread(cluster.stop)
        drop_database(database_url)
        drop_database(alone_database)
    figures = {name: summary(values) for name, values in times.items()}
    print(f"1+1 over HTTP, {n} each, interleaved")
    for name, figure in figures.items():
        print(f"  {name:22} p50 {figure['p50']:.3f} ms   p95 {figure['p95']:.3f} ms")
    hop = figures["through a node (TLS)"]["p50"] - figures["in process"]["p50"]
    print(f"  the hop, p50: {hop:+.3f} ms (target <= +1.5 ms)")
    made = summary(created)
    print(f"session create in cluster mode, warm kernels on the nodes: p50 {made['p50']:.1f} ms, "
          f"p95 {made['p95']:.1f} ms (target p50 <= 15 ms)")
    print(f"throughput, {clients} clients, {seconds:g} s each in {rounds} windows after "
          f"{warmup:g} s of warm-up")
    for index, what in enumerate(("recorded", "answered (records may lag)")):
        cluster_rate = sum(r[1 - index] for r in rates["cluster"]) / rounds
        alone_rate = sum(r[1 - index] for r in rates["one process"]) / rounds
        windows = {name: ", ".join(f"{r[1 - index]:.0f}" for r in rates[name]) for name in rates}
        target = " (target >= 0.8x)" if index == 0 else ""
        print(f"  {what}: 2 gateways x 3 nodes {cluster_rate:.0f}/s ({windows['cluster']}), "
              f"one process {alone_rate:.0f}/s ({windows['one process']}): "
              f"{cluster_rate / alone_rate:.2f}x{target}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="1+1 executions per side")
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=15,
                        help="throughput: seconds of measurement per side")
    parser.add_argument("--rounds", type=int, default=3,
                        help="throughput: windows per side, alternating")
    parser.add_argument("--warmup", type=float, default=3,
                        help="throughput: seconds each side runs before it is measured")
    args = parser.parse_args()
    asyncio.run(main(args.n, args.clients, args.seconds, args.rounds, args.warmup))
