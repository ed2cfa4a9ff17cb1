"""The contenders, each started on this machine by the benchmark and driven as a client would.

- :class:`Replgate`: ``replgate serve`` (Docker sandboxes), over HTTP and its WebSocket;
- :class:`Floor`: a stock ipykernel on the host driven by jupyter_client on its ZMQ channels
  (ipc, like replgate's kernels): no container, no gateway, no caps;
- :class:`KernelGateway`: Jupyter Kernel Gateway (``python -m kernel_gateway``) over its
  kernel WebSocket; with ``nodelay`` it runs with TCP_NODELAY set on that WebSocket
  (:mod:`bench._kg_nodelay`), to show what stalls it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import docker
import httpx
import websockets
from jupyter_client.manager import AsyncKernelManager

from kernel_pool.backends.docker._cgroup import CgroupReader, read_pseudo_file

ROOT = Path(__file__).resolve().parent.parent
OWNER_LABEL = "io.replgate.owner"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _poll(check: Callable[[], Any], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError, OSError):
            if await check():
                return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{what} within {timeout_s:g}s")


def _stop(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


# -- replgate ---------------------------------------------------------------------------------


class Replgate:
    """``replgate serve`` in a subprocess, with its own state directory and container label."""

    image = "replgate-sandbox:latest"
    """The sandbox image every instance runs (the bench sets it to this checkout's build)."""

    def __init__(self, min_idle: int | None, max_kernels: int | None, root: Path = ROOT,
                 image: str | None = None, runtime: str = "runc",
                 settings: dict[str, str] | None = None) -> None:
        """``root`` and ``image``: another checkout's code and sandbox image (say, to compare
        with an earlier version in the same run); ``runtime``: runc or gvisor; ``settings``:
        more ``REPLGATE_*`` variables, over the benchmark's. ``min_idle``, ``max_kernels``:
        None leaves them at a default install's."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}"
        self.key = f"rg_bench_{secrets.token_hex(8)}"
        self.owner = f"bench-{secrets.token_hex(4)}"
        self.state = Path(tempfile.mkdtemp(prefix="rg-bench-", dir="/tmp"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("REPLGATE_")}
        env.update({"REPLGATE_STATE_DIR": str(self.state), "REPLGATE_API_KEYS": f"b:{self.key}",
                    "REPLGATE_OWNER": self.owner, "REPLGATE_WORKSPACE_SIZE": "256m",
                    "REPLGATE_IMAGE": image or self.image,
                    "REPLGATE_MAX_SESSIONS_PER_TENANT": "256",
                    "REPLGATE_MAX_CONCURRENT_EXECUTIONS_PER_TENANT": "256",
                    "REPLGATE_LOG_LEVEL": "warning", "REPLGATE_RUNTIME": runtime,
                    # A stopped contender leaves nothing running (its sessions are deleted).
                    "REPLGATE_KEEP_SESSIONS_ON_STOP": "false"})
        for name, value in (("MIN_IDLE", min_idle), ("MAX_KERNELS", max_kernels)):
            if value is not None:
                env[f"REPLGATE_{name}"] = str(value)
        env.update(settings or {})
        self.log = self.state.with_suffix(".log")
        """The gateway's own log (warnings and errors), kept after the run."""
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway.cli", "serve", "--port", str(self.port)],
                env=env, cwd=root, stdout=log, stderr=log, start_new_session=True)
        self.headers = {"Authorization": f"Bearer {self.key}"}
        self.http = httpx.AsyncClient(base_url=self.url, headers=self.headers, timeout=300)

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def pool(self) -> dict[str, Any]:
        pool: dict[str, Any] = (await self.http.get("/healthz")).json()["pool"]
        return pool

    async def wait_idle(self, n: int, timeout_s: float = 300) -> None:
        async def enough() -> bool:
            return int((await self.pool())["idle"]) >= n

        await _poll(enough, timeout_s, f"replgate: {n} warm kernels")

    async def wait_template(self, timeout_s: float = 300) -> None:
        """Have this gateway make its default profile's kernel template (its first kernel
        starts that) and wait until it is on disk, so cold starts restore rather than boot."""
        await self.wait_idle(0, timeout_s)  # the gateway answers
        await self.delete_session(await self.create_session())

        async def made() -> bool:
            return any((self.state / "templates").glob("*/template.json"))

        await _poll(made, timeout_s, "replgate: a kernel template")

    async def create_session(self) -> str:
        response = await self.http.post("/v1/sessions", json={})
        response.raise_for_status()
        return str(response.json()["id"])

    async def delete_session(self, sid: str) -> None:
        await self.http.delete(f"/v1/sessions/{sid}")

    async def http_execute(self, sid: str, code: str) -> dict[str, Any]:
        response = await self.http.post(f"/v1/sessions/{sid}/execute", json={"code": code})
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    async def connect(self, sid: str) -> ReplgateSocket:
        ws = await websockets.connect(f"{self.ws_url}/v1/sessions/{sid}/ws",
                                      additional_headers=self.headers, max_size=None,
                                      compression=None)
        return ReplgateSocket(ws)

    def sandbox_cpu_s(self) -> float:
        """CPU seconds used so far by all of this gateway's sandboxes (kernels)."""
        return sum(usage.cpu_ns or 0 for usage in self._usages()) / 1e9

    def _usages(self) -> list[Any]:
        return [reader.read() for reader, _ in self.sandboxes()]

    def sandboxes(self) -> list[tuple[CgroupReader, list[int]]]:
        """(cgroup reader, host pids) of each of this gateway's containers."""
        client = docker.from_env()
        found = []
        try:
            for container in client.containers.list(filters={"label":
                                                             f"{OWNER_LABEL}={self.owner}"}):
                reader = CgroupReader.for_pid(int(container.attrs["State"]["Pid"]))
                if reader is None or reader.procs_file is None:
                    continue
                pids = [int(p) for p in read_pseudo_file(reader.procs_file).split()]
                found.append((reader, pids))
        finally:
            client.close()
        return found

    async def stop(self) -> None:
        await self.http.aclose()
        await asyncio.to_thread(_stop, self.proc, 90)
        await asyncio.to_thread(self._remove_leftovers)

    def _remove_leftovers(self) -> None:
        client = docker.from_env()
        try:
            for container in client.containers.list(
                    all=True, filters={"label": f"{OWNER_LABEL}={self.owner}"}):
                with contextlib.suppress(docker.errors.DockerException):
                    container.remove(force=True)
        finally:
            client.close()
        subprocess.run(["rm", "-rf", str(self.state)], check=False)


class ReplgateSocket:
    """One session WebSocket; executions with client-chosen ids, as an agent sends them."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws

    async def execute(self, code: str,
                      on_frame: Callable[[dict[str, Any]], None] | None = None,
                      ) -> list[dict[str, Any]]:
        eid = uuid.uuid4().hex
        await self.ws.send(json.dumps({"type": "execute", "id": eid, "code": code}))
        frames = []
        while True:
            frame = json.loads(await self.ws.recv())
            if frame.get("execution_id") != eid:
                continue
            if on_frame is not None:
                on_frame(frame)
            frames.append(frame)
            if frame["type"] == "done":
                return frames
            if frame["type"] == "rejected":
                raise RuntimeError(f"replgate rejected the execution: {frame}")

    async def close(self) -> None:
        await self.ws.close()


# -- the floor --------------------------------------------------------------------------------


class Floor:
    """A stock ipykernel on the host, driven directly by jupyter_client (ipc transport)."""

    def __init__(self, manager: AsyncKernelManager, client: Any) -> None:
        self.manager = manager
        self.client = client

    @classmethod
    async def start(cls) -> Floor:
        where = tempfile.mkdtemp(prefix="rg-floor-", dir="/tmp")
        manager = AsyncKernelManager(kernel_name="python3", transport="ipc",
                                     ip=os.path.join(where, "k"))
        await manager.start_kernel()
        client = manager.client()
        client.start_channels()
        await client.wait_for_ready(timeout=120)
        return cls(manager, client)

    @property
    def pid(self) -> int:
        provisioner = self.manager.provisioner
        process = getattr(provisioner, "process", None)
        return int(process.pid) if process is not None else 0

    async def execute(self, code: str,
                      on_output: Callable[[dict[str, Any]], None] | None = None,
                      ) -> dict[str, Any]:
        reply: dict[str, Any] = await self.client.execute_interactive(
            code, timeout=120, output_hook=on_output or (lambda _msg: None))
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"floor kernel: {reply['content']}")
        return reply

    async def stop(self) -> None:
        self.client.stop_channels()
        await self.manager.shutdown_kernel(now=True)


# -- Jupyter Kernel Gateway -------------------------------------------------------------------


def jupyter_message(msg_type: str, content: dict[str, Any],
                    channel: str = "shell") -> dict[str, Any]:
    return {"header": {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "username": "bench",
                       "session": "bench", "date": datetime.now(UTC).isoformat(),
                       "version": "5.3"},
            "parent_header": {}, "metadata": {}, "content": content, "channel": channel}


class KernelGateway:
    """``python -m kernel_gateway`` in a subprocess (its default: kernels over TCP)."""

    def __init__(self, nodelay: bool = False) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        module = "bench._kg_nodelay" if nodelay else "kernel_gateway"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, f"--KernelGatewayApp.port={self.port}",
             "--KernelGatewayApp.ip=127.0.0.1",
             "--JupyterWebsocketPersonality.list_kernels=True"], cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.http = httpx.AsyncClient(base_url=self.url, timeout=300)

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def wait(self) -> None:
        async def up() -> bool:
            return (await self.http.get("/api")).status_code == 200

        await _poll(up, 60, "Kernel Gateway: answering")

    async def start_kernel(self) -> KernelGatewayKernel:
        """POST /api/kernels, then its WebSocket until kernel_info is answered (ready)."""
        response = await self.http.post("/api/kernels", json={"name": "python3"})
        response.raise_for_status()
        kid = str(response.json()["id"])
        ws = await websockets.connect(f"ws://127.0.0.1:{self.port}/api/kernels/{kid}/channels",
                                      max_size=None, compression=None, open_timeout=300)
        kernel = KernelGatewayKernel(self, kid, ws)
        await kernel.request(jupyter_message("kernel_info_request", {}))
        return kernel

    async def stop(self) -> None:
        await self.http.aclose()
        await asyncio.to_thread(_stop, self.proc, 30)


class KernelGatewayKernel:
    def __init__(self, gateway: KernelGateway, kid: str, ws: Any) -> None:
        self.gateway = gateway
        self.id = kid
        self.ws = ws

    async def request(self, msg: dict[str, Any],
                      on_output: Callable[[dict[str, Any]], None] | None = None,
                      ) -> list[dict[str, Any]]:
        """Send a request; every message of it until its reply and the idle status."""
        await self.ws.send(json.dumps(msg))
        reply_type = msg["header"]["msg_type"].replace("_request", "_reply")
        frames = []
        reply = idle = False
        while not (reply and idle):
            frame = json.loads(await self.ws.recv())
            if frame.get("parent_header", {}).get("msg_id") != msg["header"]["msg_id"]:
                continue
            frames.append(frame)
            if on_output is not None and frame["msg_type"] in ("stream", "display_data",
                                                              "execute_result"):
                on_output(frame)
            reply |= frame["msg_type"] == reply_type
            idle |= (frame["msg_type"] == "status"
                     and frame["content"].get("execution_state") == "idle")
        return frames

    async def execute(self, code: str,
                      on_output: Callable[[dict[str, Any]], None] | None = None,
                      ) -> list[dict[str, Any]]:
        return await self.request(jupyter_message("execute_request", {
            "code": code, "silent": False, "store_history": True, "user_expressions": {},
            "allow_stdin": False}), on_output)

    async def close(self) -> None:
        await self.ws.close()
        await self.gateway.http.delete(f"/api/kernels/{self.id}")
