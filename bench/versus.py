"""This checkout against an earlier revision, side by side in one run: what a refactor cost.

    python -m bench.versus --before REV [--n 300] [--clients 6] [--seconds 10] [--rounds 3]
                           [--cluster-rounds 1]

Each figure runs both contenders in the same run, alternating, so a drift of the machine's
speed weighs on both alike (figures are ratios or differences, never timed assertions):

- a session's start from the warm pool (a warm kernel waiting for each), p50;
- ``1+1`` over a session's WebSocket, p50 (interleaved blocks);
- throughput of ``1+1`` over HTTP with ``--clients`` concurrent clients, one session each,
  in ``--rounds`` alternating windows of ``--seconds``; the ratio is of the totals;
- the hop and cluster throughput: ``python -m bench.cluster`` of each checkout (its own code
  on both sides: nodes and gateways over mutual TLS on PostgreSQL), alternating
  ``--cluster-rounds`` times; its printed lines are shown per checkout.

REV's code runs from a temporary git worktree; both run this checkout's sandbox image (the
kernel side is not what is compared). Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._measure import Action, interleaved, summary
from bench._peers import Replgate

ROOT = Path(__file__).resolve().parents[1]
CODE = "1+1"


async def _warm_starts(gateways: dict[str, Replgate], n: int) -> dict[str, list[float]]:
    """Each start takes a warm kernel: the contender's pool is refilled before it is timed."""
    times: dict[str, list[float]] = {name: [] for name in gateways}
    for _ in range(n):
        for name, gateway in gateways.items():
            await gateway.wait_idle(1)
            start = time.perf_counter()
            sid = await gateway.create_session()
            times[name].append((time.perf_counter() - start) * 1000)
            await gateway.delete_session(sid)
    return times


async def _throughput(gateways: dict[str, Replgate], clients: int, seconds: float,
                      rounds: int) -> dict[str, float]:
    sessions = {name: [await gateway.create_session() for _ in range(clients)]
                for name, gateway in gateways.items()}
    done = dict.fromkeys(gateways, 0)
    spent = dict.fromkeys(gateways, 0.0)
    order = list(gateways)
    for round_ in range(rounds):
        for name in order if round_ % 2 == 0 else order[::-1]:
            gateway = gateways[name]
            end = time.perf_counter() + seconds

            async def client(sid: str, gateway: Replgate = gateway, end: float = end,
                             name: str = name) -> None:
                while time.perf_counter() < end:
                    await gateway.http_execute(sid, CODE)
                    done[name] += 1

            start = time.perf_counter()
            await asyncio.gather(*(client(sid) for sid in sessions[name]))
            spent[name] += time.perf_counter() - start
    for name, gateway in gateways.items():
        for sid in sessions[name]:
            await gateway.delete_session(sid)
    return {name: done[name] / spent[name] for name in gateways}


def _cluster(root: Path, rounds: int) -> str:
    """One ``bench.cluster`` run of a checkout, its figures as it printed them."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    run = subprocess.run([sys.executable, "-m", "bench.cluster", "--rounds", str(rounds)],
                         cwd=root, env=env, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        return f"failed ({run.returncode}): {run.stderr.strip().splitlines()[-1:]}"
    return run.stdout.strip()


async def main(before: str, n: int, clients: int, seconds: float, rounds: int,
               cluster_rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="rg-versus-") as tree:
        await asyncio.to_thread(subprocess.run, ["git", "worktree", "add", "--detach", tree,
                                                 before], cwd=ROOT, check=True,
                                capture_output=True)
        try:
            roots = {"now": ROOT, f"before ({before})": Path(tree)}
            await _gateways(roots, n, clients, seconds, rounds)
            for round_ in range(cluster_rounds):
                for name, root in (roots.items() if round_ % 2 == 0
                                   else reversed(roots.items())):
                    figures = await asyncio.to_thread(_cluster, root, 2)
                    print(f"\nbench.cluster, {name}:\n{figures}", flush=True)
        finally:
            await asyncio.to_thread(subprocess.run, ["git", "worktree", "remove", "--force",
                                                     tree], cwd=ROOT, check=False,
                                    capture_output=True)


async def _gateways(roots: dict[str, Path], n: int, clients: int, seconds: float,
                    rounds: int) -> None:
    gateways = {name: Replgate(2, clients + 4, root=root) for name, root in roots.items()}
    sockets = {}
    try:
        for gateway in gateways.values():
            await gateway.wait_idle(2)
        starts = {name: summary(times)
                  for name, times in (await _warm_starts(gateways, max(20, n // 10))).items()}
        for name, gateway in gateways.items():
            sockets[name] = await gateway.connect(await gateway.create_session())

        def one(name: str) -> Action:
            async def run() -> None:
                await sockets[name].execute(CODE)
            return run

        trips = {name: summary(times) for name, times in
                 (await interleaved({name: one(name) for name in gateways}, n)).items()}
        rates = await _throughput(gateways, clients, seconds, rounds)
    finally:
        for socket in sockets.values():
            with contextlib.suppress(Exception):
                await socket.ws.close()
        for gateway in gateways.values():
            await gateway.stop()
    now, before = list(roots)
    print(f"{'figure':36} {now:>14} {before:>24} {'now/before':>10}")
    for label, figures in (("warm session start, p50 ms", starts), ("1+1 over WebSocket, p50 ms",
                                                                    trips)):
        a, b = figures[now]["p50"], figures[before]["p50"]
        print(f"{label:36} {a:14.3f} {b:24.3f} {a / b:10.2f}")
    a, b = rates[now], rates[before]
    print(f"{f'throughput, {clients} clients, exec/s':36} {a:14.1f} {b:24.1f} {a / b:10.2f}")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", required=True, help="the git revision to compare with")
    parser.add_argument("--n", type=int, default=300, help="1+1 executions per contender")
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=10, help="per throughput window")
    parser.add_argument("--rounds", type=int, default=3, help="throughput windows each")
    parser.add_argument("--cluster-rounds", type=int, default=1,
                        help="bench.cluster runs per checkout (0: none)")
    args = parser.parse_args()
    asyncio.run(main(args.before, args.n, args.clients, args.seconds, args.rounds,
                     args.cluster_rounds))


if __name__ == "__main__":
    cli()
