"""replgate against the floor and against Jupyter Kernel Gateway, measured in one run.

    .venv/bin/python bench/bench_gateway.py [--quick]

Starts, on this machine: a `replgate serve` (Docker sandboxes), a stock ipykernel on the host
driven by jupyter_client (the floor), and Jupyter Kernel Gateway (`jupyter kernelgateway`).
Prints a table (p50/p95 and the ratio to each figure's baseline from the same run) and writes
it to bench/results/gateway.json. Targets are reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
import websockets
from jupyter_client.manager import AsyncKernelManager

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values: list[float]) -> dict[str, float]:
    return {"p50": pct(values, 0.5), "p95": pct(values, 0.95), "n": len(values)}


async def timed(n: int, action: Callable[[], Awaitable[Any]]) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        await action()
        out.append((time.perf_counter() - start) * 1000)
    return out


# -- processes ------------------------------------------------------------------------------


class Replgate:
    def __init__(self, min_idle: int, max_kernels: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.key = f"rg_bench_{secrets.token_hex(8)}"
        self.state = Path(tempfile.mkdtemp(prefix="rgb-", dir="/tmp"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("REPLGATE_")}
        env.update({"REPLGATE_STATE_DIR": str(self.state), "REPLGATE_API_KEYS": f"b:{self.key}",
                    "REPLGATE_MIN_IDLE": str(min_idle), "REPLGATE_MAX_KERNELS": str(max_kernels),
                    "REPLGATE_OWNER": f"bench-{secrets.token_hex(3)}",
                    "REPLGATE_MAX_SESSIONS_PER_TENANT": "256",
                    "REPLGATE_MAX_CONCURRENT_EXECUTIONS_PER_TENANT": "256",
                    "REPLGATE_LOG_LEVEL": "warning"})
        self.proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--port",
                                      str(self.port)], env=env, cwd=ROOT,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        self.headers = {"Authorization": f"Bearer {self.key}"}

    async def wait_idle(self, n: int) -> None:
        async with httpx.AsyncClient() as c:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                try:
                    pool = (await c.get(f"{self.url}/healthz")).json()["pool"]
                    if pool["idle"] >= n:
                        return
                except (httpx.HTTPError, KeyError):
                    pass
                await asyncio.sleep(0.1)
        raise RuntimeError("replgate pool did not fill")

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(60)


class KernelGateway:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kernel_gateway", f"--KernelGatewayApp.port={self.port}",
             "--KernelGatewayApp.ip=127.0.0.1", "--JupyterWebsocketPersonality.list_kernels=True"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    async def wait(self) -> None:
        async with httpx.AsyncClient() as c:
            for _ in range(300):
                try:
                    if (await c.get(f"{self.url}/api")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
        raise RuntimeError("kernel gateway did not start")

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(30)


# -- Jupyter websocket protocol (Kernel Gateway) ---------------------------------------------


def jmsg(msg_type: str, content: dict[str, Any], channel: str = "shell") -> dict[str, Any]:
    return {"header": {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "username": "bench",
                       "session": "bench", "date": datetime.now(UTC).isoformat(),
                       "version": "5.3"},
            "parent_header": {}, "metadata": {}, "content": content, "channel": channel}


async def kg_execute(ws: Any, code: str) -> None:
    msg = jmsg("execute_request", {"code": code, "silent": False, "store_history": True,
                                   "user_expressions": {}, "allow_stdin": False})
    await ws.send(json.dumps(msg))
    reply = idle = False
    while not (reply and idle):
        frame = json.loads(await ws.recv())
        if frame.get("parent_header", {}).get("msg_id") != msg["header"]["msg_id"]:
            continue
        reply |= frame["msg_type"] == "execute_reply"
        idle |= (frame["msg_type"] == "status"
                 and frame["content"].get("execution_state") == "idle")


async def kg_start(c: httpx.AsyncClient, url: str) -> tuple[str, Any]:
    kernel = (await c.post(f"{url}/api/kernels", json={"name": "python3"})).json()
    channels = url.replace("http", "ws") + f"/api/kernels/{kernel['id']}/channels"
    ws = await websockets.connect(channels, max_size=None)
    await ws.send(json.dumps(jmsg("kernel_info_request", {})))
    while json.loads(await ws.recv())["msg_type"] != "kernel_info_reply":
        pass
    return kernel["id"], ws


# -- replgate helpers ------------------------------------------------------------------------


async def rg_ws(rg: Replgate, sid: str) -> Any:
    return await websockets.connect(rg.url.replace("http", "ws") + f"/v1/sessions/{sid}/ws",
                                    additional_headers=rg.headers, max_size=None)


async def rg_ws_execute(ws: Any, code: str) -> list[dict[str, Any]]:
    eid = uuid.uuid4().hex
    await ws.send(json.dumps({"type": "execute", "code": code, "id": eid}))
    frames = []
    while True:
        frame = json.loads(await ws.recv())
        if frame.get("execution_id") == eid:
            frames.append(frame)
            if frame["type"] == "done":
                return frames


# -- the figures -----------------------------------------------------------------------------


async def bench(quick: bool) -> dict[str, Any]:
    n_rt = 60 if quick else 300
    n_start = 4 if quick else 12
    fig: dict[str, Any] = {}

    # floor: a stock ipykernel on the host, driven directly
    km = AsyncKernelManager(kernel_name="python3")
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=60)

    async def floor_exec(code: str = "1+1") -> None:
        await kc.execute_interactive(code, timeout=60)

    await timed(20, floor_exec)
    fig["floor_execute_ms"] = summary(await timed(n_rt, floor_exec))

    rg = Replgate(min_idle=2, max_kernels=40)
    kg = KernelGateway()
    try:
        await rg.wait_idle(2)
        await kg.wait()
        async with httpx.AsyncClient(headers=rg.headers, timeout=120) as c:
            warm = []
            for _ in range(n_start):
                await rg.wait_idle(1)
                t = time.perf_counter()
                sid = (await c.post(f"{rg.url}/v1/sessions", json={})).json()["id"]
                warm.append((time.perf_counter() - t) * 1000)
                await c.delete(f"{rg.url}/v1/sessions/{sid}")
            fig["replgate_session_start_warm_ms"] = summary(warm)

            cold = []
            for _ in range(max(3, n_start // 3)):
                # a pool with nothing idle: take the warm kernels first, then time one more
                await rg.wait_idle(2)
                held = [(await c.post(f"{rg.url}/v1/sessions", json={})).json()["id"]
                        for _ in range(2)]
                t = time.perf_counter()
                sid = (await c.post(f"{rg.url}/v1/sessions", json={})).json()["id"]
                cold.append((time.perf_counter() - t) * 1000)
                for s in [*held, sid]:
                    await c.delete(f"{rg.url}/v1/sessions/{s}")
            fig["replgate_session_start_cold_ms"] = summary(cold)

            async with httpx.AsyncClient(timeout=120) as kc_http:
                kg_starts = []
                for _ in range(max(3, n_start // 3)):
                    t = time.perf_counter()
                    kid, kws = await kg_start(kc_http, kg.url)
                    kg_starts.append((time.perf_counter() - t) * 1000)
                    await kws.close()
                    await kc_http.delete(f"{kg.url}/api/kernels/{kid}")
                fig["kernel_gateway_kernel_start_ms"] = summary(kg_starts)

                await rg.wait_idle(1)
                sid = (await c.post(f"{rg.url}/v1/sessions", json={})).json()["id"]

                async def rg_http() -> None:
                    await c.post(f"{rg.url}/v1/sessions/{sid}/execute", json={"code": "1+1"})

                await timed(20, rg_http)
                fig["replgate_http_execute_ms"] = summary(await timed(n_rt, rg_http))
                ws = await rg_ws(rg, sid)
                await timed(20, lambda: rg_ws_execute(ws, "1+1"))
                fig["replgate_ws_execute_ms"] = summary(
                    await timed(n_rt, lambda: rg_ws_execute(ws, "1+1")))

                kid, kws = await kg_start(kc_http, kg.url)
                await timed(20, lambda: kg_execute(kws, "1+1"))
                fig["kernel_gateway_ws_execute_ms"] = summary(
                    await timed(n_rt, lambda: kg_execute(kws, "1+1")))
                await kws.close()
                await kc_http.delete(f"{kg.url}/api/kernels/{kid}")

                # streaming: print time to arrival, while the cell keeps running
                eid = uuid.uuid4().hex
                await ws.send(json.dumps({"type": "execute", "id": eid, "code":
                    "import time\nfor _ in range(40):\n"
                    "    print(time.time(), flush=True); time.sleep(0.05)"}))
                lags = []
                while True:
                    frame = json.loads(await ws.recv())
                    if frame.get("execution_id") != eid:
                        continue
                    if frame["type"] == "done":
                        break
                    for line in frame.get("text", "").split():
                        lags.append((time.time() - float(line)) * 1000)
                fig["replgate_stream_latency_ms"] = summary(lags)

                chart = ("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
                fig["replgate_chart_ws_ms"] = summary(
                    await timed(10 if quick else 30, lambda: rg_ws_execute(ws, chart)))

                async def floor_chart() -> None:
                    await kc.execute_interactive(
                        "%matplotlib inline\n" + chart, timeout=60)

                fig["floor_chart_ms"] = summary(await timed(10 if quick else 30, floor_chart))

                # flood: the gateway's peak RSS while one session prints 100 MB
                gw = psutil.Process(rg.proc.pid)
                base_rss = gw.memory_info().rss
                peak = base_rss
                flood = asyncio.create_task(rg_ws_execute(
                    ws, "for _ in range(100):\n    print('x' * 1_000_000)"))
                while not flood.done():
                    peak = max(peak, gw.memory_info().rss)
                    await asyncio.sleep(0.02)
                frames = flood.result()
                fig["replgate_flood_gateway_rss_mb"] = {
                    "before": base_rss / 2**20, "peak": peak / 2**20,
                    "truncated": frames[-1].get("truncated"),
                    "duration_ms": frames[-1].get("duration_ms")}
                await ws.close()
                await c.delete(f"{rg.url}/v1/sessions/{sid}")

                # density: memory of one idle warm kernel's container
                fig["replgate_idle_kernel_memory_mb"] = idle_kernel_memory_mb()

                # throughput
                secs = 3.0 if quick else 8.0
                for n in ((1, 8) if quick else (1, 8, 32)):
                    fig[f"throughput_{n}"] = {
                        "replgate_ws": await rg_throughput(rg, c, n, secs),
                        "floor": await floor_throughput(n, secs),
                        "kernel_gateway": await kg_throughput(kg, kc_http, n, secs)}
    finally:
        rg.stop()
        kg.stop()
        kc.stop_channels()
        await km.shutdown_kernel(now=True)
    return fig


def idle_kernel_memory_mb() -> dict[str, float] | None:
    import docker

    client = docker.from_env()
    found = []
    for container in client.containers.list(filters={"label": "io.replgate.sandbox"}):
        stats = container.stats(stream=False)
        mem = stats.get("memory_stats", {})
        usage = mem.get("usage", 0) - mem.get("stats", {}).get("total_inactive_file",
                                                                 mem.get("stats", {}).get(
                                                                     "inactive_file", 0))
        rss = mem.get("stats", {}).get("total_rss") or mem.get("stats", {}).get("anon")
        found.append((rss or usage) / 2**20)
    if not found:
        return None
    per = statistics.median(found)
    return {"per_kernel_mb": per, "fit_in_machine": int(psutil.virtual_memory().total / 2**20
                                                         * 0.8 // per)}


async def rg_throughput(rg: Replgate, c: httpx.AsyncClient, n: int, secs: float) -> float:
    await rg.wait_idle(min(n, 2))
    sids = [(await c.post(f"{rg.url}/v1/sessions", json={})).json()["id"] for _ in range(n)]
    sockets = [await rg_ws(rg, sid) for sid in sids]
    for ws in sockets:
        await rg_ws_execute(ws, "1+1")
    count = 0
    end = time.perf_counter() + secs

    async def loop(ws: Any) -> None:
        nonlocal count
        while time.perf_counter() < end:
            await rg_ws_execute(ws, "1+1")
            count += 1

    await asyncio.gather(*(loop(ws) for ws in sockets))
    for ws in sockets:
        await ws.close()
    for sid in sids:
        await c.delete(f"{rg.url}/v1/sessions/{sid}")
    return count / secs


async def floor_throughput(n: int, secs: float) -> float:
    managers = []
    for _ in range(n):
        km = AsyncKernelManager(kernel_name="python3")
        await km.start_kernel()
        kc = km.client()
        kc.start_channels()
        await kc.wait_for_ready(timeout=120)
        managers.append((km, kc))
    count = 0
    end = time.perf_counter() + secs

    async def loop(kc: Any) -> None:
        nonlocal count
        while time.perf_counter() < end:
            await kc.execute_interactive("1+1", timeout=60)
            count += 1

    await asyncio.gather(*(loop(kc) for _, kc in managers))
    for km, kc in managers:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)
    return count / secs


async def kg_throughput(kg: KernelGateway, c: httpx.AsyncClient, n: int, secs: float) -> float:
    kernels = [await kg_start(c, kg.url) for _ in range(n)]
    count = 0
    end = time.perf_counter() + secs

    async def loop(ws: Any) -> None:
        nonlocal count
        while time.perf_counter() < end:
            await kg_execute(ws, "1+1")
            count += 1

    await asyncio.gather(*(loop(ws) for _, ws in kernels))
    for kid, ws in kernels:
        await ws.close()
        await c.delete(f"{kg.url}/api/kernels/{kid}")
    return count / secs


def report(fig: dict[str, Any]) -> str:
    def row(name: str, key: str, base: str | None, target: str) -> str:
        s = fig.get(key)
        if not isinstance(s, dict) or "p50" not in s:
            return f"| {name} | n/a | | | {target} |"
        ratio = ""
        if base and isinstance(fig.get(base), dict):
            ratio = f"{s['p50'] / fig[base]['p50']:.2f}x {base}"
        return f"| {name} | {s['p50']:.2f} | {s['p95']:.2f} | {ratio} | {target} |"

    lines = ["| figure (ms) | p50 | p95 | ratio (p50) | target |",
             "| --- | --- | --- | --- | --- |",
             row("session start, warm pool", "replgate_session_start_warm_ms",
                 "replgate_session_start_cold_ms", "< 10 ms"),
             row("session start, cold", "replgate_session_start_cold_ms", None, ""),
             row("Kernel Gateway kernel start", "kernel_gateway_kernel_start_ms",
                 "replgate_session_start_warm_ms", ""),
             row("execute 1+1, floor (host ipykernel)", "floor_execute_ms", None, ""),
             row("execute 1+1, replgate HTTP", "replgate_http_execute_ms", "floor_execute_ms",
                 ""),
             row("execute 1+1, replgate WebSocket", "replgate_ws_execute_ms", "floor_execute_ms",
                 "< floor + 1 ms"),
             row("execute 1+1, Kernel Gateway WebSocket", "kernel_gateway_ws_execute_ms",
                 "floor_execute_ms", ""),
             row("print to client, replgate WS", "replgate_stream_latency_ms", None, ""),
             row("matplotlib PNG, replgate WS", "replgate_chart_ws_ms", "floor_chart_ms", ""),
             row("matplotlib PNG, floor", "floor_chart_ms", None, "")]
    for key, value in fig.items():
        if key.startswith("throughput_"):
            floor = value["floor"] or 1
            lines.append(f"| throughput {key.split('_')[1]} sessions (exec/s) | "
                         f"replgate {value['replgate_ws']:.0f} | floor {value['floor']:.0f} | "
                         f"{value['replgate_ws'] / floor:.2f}x floor; KG "
                         f"{value['kernel_gateway']:.0f} | >= 0.9x floor at 32 |")
    mem = fig.get("replgate_idle_kernel_memory_mb")
    if mem:
        lines.append(f"| memory per idle warm kernel (MiB) | {mem['per_kernel_mb']:.0f} | | "
                     f"~{mem['fit_in_machine']} fit in 80% of RAM | < 100 MiB |")
    flood = fig.get("replgate_flood_gateway_rss_mb", {})
    if flood:
        lines.append(f"| gateway RSS during a 100 MB flood (MB) | peak {flood['peak']:.0f} | "
                     f"before {flood['before']:.0f} | | < 250 MB |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    fig = asyncio.run(bench(args.quick))
    fig["_machine"] = {"cpus": os.cpu_count(), "memory_gib": round(
        psutil.virtual_memory().total / 2**30, 1), "platform": platform.platform(),
        "date": datetime.now(UTC).isoformat()}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "gateway.json").write_text(json.dumps(fig, indent=2))
    print(report(fig))


if __name__ == "__main__":
    main()
