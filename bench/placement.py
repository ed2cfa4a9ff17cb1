"""Placement under contention: two gateways claiming slots for 1,000 sessions at once on three
nodes, in PostgreSQL (the claim alone: no kernel starts).

    python -m bench.placement [--sessions 1000] [--workers 1,4,8] [--database-url postgresql://...]

Each gateway is a process of its own with its own engine (as two ``replgate serve`` would be);
both start together on a new database made for the run (on ``--database-url``'s server,
``REPLGATE_TEST_POSTGRES`` by default, as ``./run.sh test`` sets it) and dropped after it.
Two rounds on the same three nodes:

- **steady**, once for each of ``--workers``: each gateway keeps that many claims in flight
  (fewer than its engine's connections), so a claim's time is the database's and the other
  claims' doing, not a wait for a connection of its own gateway; the rounds side by side show
  how much of it is queueing behind the other claims;
- **burst**: each gateway asks for all of its slots at once; the claims queue for its
  connections, and the round's wall time and rate say how fast the database hands slots out.

For each it prints the claims' p50/p99 (the goal of issue 27: p99 <= 20 ms), and checks, and
prints, that every claim got a slot of its own (no two claims on a node saw the same count,
so no session was placed twice) and that no node went over its capacity. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import secrets
import sys
import time
from collections import Counter
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from urllib.parse import urlsplit, urlunsplit

import psycopg

from common.database import Database
from kernel_pool import NodeRecord, NoNodeAvailable
from node.registry import Registry

DEFAULT_SERVER = os.environ.get("REPLGATE_TEST_POSTGRES",
                                "postgresql://replgate:replgate@127.0.0.1:5432/replgate")
NODES = 3
GATEWAYS = 2


@dataclass
class Claim:
    """One claim as its gateway saw it."""

    ms: float
    node: str | None
    """The node it got, or None when it was refused (every node full)."""
    count: int
    """The node's count right after this claim: its slot's number."""


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _gateway(url: str, claims: int, workers: int | None,
                   go: Event) -> tuple[list[Claim], float]:
    database = await Database.open(url)
    registry = Registry(database, heartbeat_timeout_s=600)
    try:
        # The engine's connections are opened before the start: a first connection's
        # handshake is no claim's cost.
        await asyncio.gather(*(registry.get("warm-up") for _ in range(workers or 5)))
        await asyncio.to_thread(go.wait)
        cpu = time.process_time()
        out: list[Claim] = []
        left = claims

        async def claim() -> None:
            start = time.perf_counter()
            try:
                node = await registry.place()
            except NoNodeAvailable:
                out.append(Claim((time.perf_counter() - start) * 1000, None, 0))
                return
            out.append(Claim((time.perf_counter() - start) * 1000, node.id, node.sessions))

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await claim()

        if workers is None:
            await asyncio.gather(*(claim() for _ in range(claims)))
        else:
            await asyncio.gather(*(worker() for _ in range(workers)))
        return out, time.process_time() - cpu
    finally:
        await database.close()


def _child(url: str, claims: int, workers: int | None, go: Event,
           results: Queue[tuple[list[Claim], float]]) -> None:
    results.put(asyncio.run(_gateway(url, claims, workers, go)))


async def _register(url: str, capacity: int) -> None:
    database = await Database.open(url)
    try:
        registry = Registry(database, heartbeat_timeout_s=600)
        for n in range(NODES):
            await registry.register(f"node-{n}", f"10.0.0.{n + 1}:7070", capacity)
    finally:
        await database.close()


async def _nodes(url: str) -> list[NodeRecord]:
    database = await Database.open(url)
    try:
        return await Registry(database).nodes()
    finally:
        await database.close()


def _round(url: str, name: str, sessions: int, capacity: int, workers: int | None) -> None:
    asyncio.run(_register(url, capacity))  # every node empty again
    context = multiprocessing.get_context("spawn")
    go = context.Event()
    results: Queue[tuple[list[Claim], float]] = context.Queue()
    share = sessions // GATEWAYS
    processes = [context.Process(target=_child, args=(url, share, workers, go, results))
                 for _ in range(GATEWAYS)]
    for process in processes:
        process.start()
    time.sleep(3)  # both engines connected and waiting (a spawned interpreter starts slowly)
    start = time.perf_counter()
    go.set()
    answers = [results.get(timeout=600) for _ in processes]
    wall = time.perf_counter() - start
    claims = [claim for got, _ in answers for claim in got]
    cpu_ms = sum(cpu for _, cpu in answers) * 1000
    for process in processes:
        process.join()
    placed = [c for c in claims if c.node is not None]
    ms = [c.ms for c in placed]
    by_node = Counter(c.node for c in placed)
    slots = Counter((c.node, c.count) for c in placed)
    twice = sum(n - 1 for n in slots.values() if n > 1)
    nodes = asyncio.run(_nodes(url))
    over = [n.id for n in nodes if n.sessions > n.max_kernels]
    in_flight = f"{workers} claims in flight per gateway" if workers else "all at once"
    print(f"{name}: {GATEWAYS} gateways x {share} claims ({in_flight}) on {NODES} nodes of "
          f"{capacity}")
    print(f"  claim  p50 {_pct(ms, 0.5):6.2f} ms   p99 {_pct(ms, 0.99):6.2f} ms   "
          f"max {max(ms):6.2f} ms   (goal: p99 <= 20 ms)")
    print(f"  round  {wall:6.2f} s wall, {len(placed) / wall:6.0f} claims/s; the gateways' CPU: "
          f"{cpu_ms / len(claims):.2f} ms a claim")
    print(f"  placed {len(placed)} of {len(claims)} (refused: {len(claims) - len(placed)}); "
          f"per node {dict(sorted(by_node.items()))}; database says "
          f"{[(n.id, n.sessions, n.max_kernels) for n in nodes]}")
    counts_agree = all(by_node[n.id] == n.sessions for n in nodes)
    print(f"  check  placed twice: {twice}; over capacity: {over or 'none'}; "
          f"claims and counts agree: {'yes' if counts_agree else 'NO'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--workers", default="1,4,8",
                        help="claims in flight per gateway in the steady rounds, one round each")
    parser.add_argument("--capacity", type=int, default=0,
                        help="each node's max_kernels (default: room for every claim, "
                        "with 2%% to spare)")
    parser.add_argument("--database-url", default=DEFAULT_SERVER,
                        help="a PostgreSQL server and a role that may create databases")
    args = parser.parse_args()
    capacity = args.capacity or -(-args.sessions * 102 // 100 // NODES)
    name = f"rg_bench_{secrets.token_hex(4)}"
    server = args.database_url
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = urlunsplit(urlsplit(server)._replace(path=f"/{name}"))
    try:
        with psycopg.connect(url) as db:
            version = db.execute("SHOW server_version").fetchone()
        print(f"PostgreSQL {version[0] if version else '?'}, {os.cpu_count()} cores, "
              f"python {sys.version.split()[0]}")
        for workers in (int(n) for n in args.workers.split(",")):
            _round(url, "steady", args.sessions, capacity, workers)
        _round(url, "burst", args.sessions, capacity, None)
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
