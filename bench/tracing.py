"""What OpenTelemetry tracing costs an execution: ``1+1`` over the WebSocket, traced and not.

    python -m bench.tracing [--n 400] [--before REF]

Gateways of this checkout run side by side: one with traces on (the always-on sampler, the
batch exporter sending OTLP/HTTP to a receiver on this machine that decodes every span:
tests/otlp_receiver.py, in a process of its own as a collector is), one the same without
SQLAlchemy's spans (``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=sqlalchemy``), one with no OTEL_*
variable (no SDK at all). With ``--before REF``, a third runs the code of that git revision (a
worktree made for the run), to show that with tracing off nothing changed. Each does ``1+1`` on
its session's WebSocket in interleaved rounds; the p50s and their differences are printed
(target: traced <= 0.3 ms p50 above untraced).

Each configuration runs in ``--instances`` gateways (2 by default), its figures pooled: on 2
cores one gateway's p50 differed from another's of the same configuration by up to 1.4 ms,
run after run (where the scheduler happened to put it and its kernel), more than the
difference measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._measure import Action, interleaved, summary, threads_cpu_s
from bench._peers import ROOT, Replgate

CODE = "1+1"


@dataclass
class Received:
    """What the receiver decoded: its exports and the names of the spans in them."""

    endpoint: str
    requests: int = 0
    names: list[str] = field(default_factory=list)


@contextlib.asynccontextmanager
async def receiver_process() -> AsyncIterator[Received]:
    """The OTLP receiver in a process of its own: decoding in this one would hold the GIL the
    client timing the gateways needs."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.otlp_receiver", cwd=ROOT, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE)
    assert process.stdin is not None and process.stdout is not None
    received = Received((await process.stdout.readline()).decode().strip())
    try:
        yield received
    finally:
        process.stdin.close()
        answer = json.loads(await process.stdout.read())
        await process.wait()
        received.requests, received.names = answer["requests"], answer["names"]


async def main(n: int, before: str | None, instances: int) -> None:
    async with contextlib.AsyncExitStack() as stack:
        tree = stack.enter_context(tempfile.TemporaryDirectory(prefix="rg-before-"))
        receiver = await stack.enter_async_context(receiver_process())
        traced_env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                      "OTEL_TRACES_SAMPLER": "always_on", "OTEL_SERVICE_NAME": "replgate-bench"}
        configurations: dict[str, dict[str, Any]] = {
            "traced": {"settings": traced_env},
            "traced, no SQL spans": {"settings": {
                **traced_env, "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "sqlalchemy"}},
            "untraced": {}}
        if before is not None:
            await asyncio.to_thread(subprocess.run, ["git", "worktree", "add", "--detach", tree,
                                                     before], cwd=ROOT, check=True,
                                    capture_output=True)
            configurations[f"before ({before})"] = {"root": Path(tree)}
        labels = {name: [f"{name} #{i}" for i in range(instances)] for name in configurations}
        gateways = {label: Replgate(1, 4, **configurations[name])
                    for name in configurations for label in labels[name]}
        sockets = {}
        try:
            for gateway in gateways.values():
                await gateway.wait_idle(1)
            for label, gateway in gateways.items():
                sockets[label] = await gateway.connect(await gateway.create_session())

            def action(label: str) -> Action:
                socket = sockets[label]

                async def one() -> None:
                    await socket.execute(CODE)

                return one

            cpu_s = dict.fromkeys(gateways, 0.0)

            @contextlib.contextmanager
            def metering(label: str) -> Iterator[None]:
                before = threads_cpu_s(gateways[label].pid)
                yield
                cpu_s[label] += threads_cpu_s(gateways[label].pid) - before

            each = await interleaved({label: action(label) for label in gateways},
                                     n // instances, warmup=30, rounds=20, around=metering)
        finally:
            for socket in sockets.values():
                await socket.close()
            for gateway in gateways.values():
                await gateway.stop()
            if before is not None:
                await asyncio.to_thread(subprocess.run, ["git", "worktree", "remove", "--force",
                                                         tree], cwd=ROOT, check=False,
                                        capture_output=True)
        await asyncio.sleep(1)  # the batch's last export
    figures = {name: summary([time for label in labels[name] for time in each[label]])
               for name in configurations}
    cpu_ms = {name: sum(cpu_s[label] for label in labels[name]) * 1000 / figures[name]["n"]
              for name in configurations}
    print(f"1+1 over the WebSocket, {n} each in {instances} gateways, interleaved")
    for name, figure in figures.items():
        per_gateway = ", ".join(f"{summary(each[label])['p50']:.3f}" for label in labels[name])
        print(f"  {name:24} p50 {figure['p50']:.3f} ms   p95 {figure['p95']:.3f} ms   "
              f"gateway CPU {cpu_ms[name]:.3f} ms/execution   (p50 per gateway: {per_gateway})")
    for name in ("traced", "traced, no SQL spans"):
        difference = figures[name]["p50"] - figures["untraced"]["p50"]
        print(f"  {name} - untraced p50: {difference * 1000:+.0f} us (target <= +300 us); "
              f"gateway CPU {(cpu_ms[name] - cpu_ms['untraced']) * 1000:+.0f} us/execution")
    for name in figures:
        if name.startswith("before"):
            change = figures["untraced"]["p50"] - figures[name]["p50"]
            print(f"  untraced - {name} p50: {change * 1000:+.0f} us")
    names = Counter(receiver.names)
    executes = names["replgate.execute"]
    print(f"  the receiver decoded {len(receiver.names)} spans in {receiver.requests} exports, "
          f"{len(receiver.names) / max(1, executes):.1f} per execution:")
    for name, count in names.most_common(12):
        print(f"    {count / max(1, executes):5.2f}  {name}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=400, help="executions per gateway")
    parser.add_argument("--before", help="a git revision to run untraced as well")
    parser.add_argument("--instances", type=int, default=2,
                        help="gateways per configuration, their figures pooled")
    args = parser.parse_args()
    asyncio.run(main(args.n, args.before, args.instances))
