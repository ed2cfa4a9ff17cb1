"""What OpenTelemetry tracing costs an execution: ``1+1`` over the WebSocket, traced and not.

    python -m bench.tracing [--n 400] [--before REF]

Gateways of this checkout run side by side: one with traces on (the always-on sampler, the
batch exporter sending OTLP/HTTP to a receiver on this machine that decodes every span:
tests/otlp_receiver.py), one the same without SQLAlchemy's spans
(``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=sqlalchemy``), one with no OTEL_* variable (no SDK at
all). With ``--before REF``,
a third runs the code of that git revision (a worktree made for the run), to show that with
tracing off nothing changed. Each does ``1+1`` on its session's WebSocket in interleaved rounds;
the p50s and their differences are printed (target: traced <= 0.3 ms p50 above untraced).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from bench._measure import Action, interleaved, summary
from bench._peers import ROOT, Replgate
from tests.otlp_receiver import OtlpReceiver

CODE = "1+1"


async def main(n: int, before: str | None) -> None:
    with OtlpReceiver() as receiver, tempfile.TemporaryDirectory(prefix="rg-before-") as tree:
        traced_env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                      "OTEL_TRACES_SAMPLER": "always_on", "OTEL_SERVICE_NAME": "replgate-bench"}
        gateways = {"traced": Replgate(1, 4, settings=traced_env),
                    "traced, no SQL spans": Replgate(1, 4, settings={
                        **traced_env, "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "sqlalchemy"}),
                    "untraced": Replgate(1, 4)}
        if before is not None:
            await asyncio.to_thread(subprocess.run, ["git", "worktree", "add", "--detach", tree,
                                                     before], cwd=ROOT, check=True,
                                    capture_output=True)
            gateways[f"before ({before})"] = Replgate(1, 4, root=Path(tree))
        sockets = {}
        try:
            for gateway in gateways.values():
                await gateway.wait_idle(1)
            for name, gateway in gateways.items():
                sockets[name] = await gateway.connect(await gateway.create_session())

            def action(name: str) -> Action:
                socket = sockets[name]

                async def one() -> None:
                    await socket.execute(CODE)

                return one

            times = await interleaved({name: action(name) for name in gateways}, n,
                                      warmup=30, rounds=20)
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
        spans = receiver.snapshot()
    figures = {name: summary(values) for name, values in times.items()}
    print(f"1+1 over the WebSocket, {n} each, interleaved")
    for name, figure in figures.items():
        print(f"  {name:24} p50 {figure['p50']:.3f} ms   p95 {figure['p95']:.3f} ms")
    for name in ("traced", "traced, no SQL spans"):
        difference = figures[name]["p50"] - figures["untraced"]["p50"]
        print(f"  {name} - untraced p50: {difference * 1000:+.0f} us (target <= +300 us)")
    for name in figures:
        if name.startswith("before"):
            change = figures["untraced"]["p50"] - figures[name]["p50"]
            print(f"  untraced - {name} p50: {change * 1000:+.0f} us")
    names = Counter(span.name for span in spans)
    executes = names["replgate.execute"]
    print(f"  the receiver decoded {len(spans)} spans in {receiver.requests} exports, "
          f"{len(spans) / max(1, executes):.1f} per execution:")
    for name, count in names.most_common(12):
        print(f"    {count / max(1, executes):5.2f}  {name}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=400, help="executions per gateway")
    parser.add_argument("--before", help="a git revision to run untraced as well")
    args = parser.parse_args()
    asyncio.run(main(args.n, args.before))
