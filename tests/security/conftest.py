"""Fixtures for attacking replgate through its public API and checking the outcome from the host.

``hostile`` is a real ``replgate serve`` with small limits (512 MiB, 128 processes, a 64 MiB
workspace, a 32 MiB /tmp), so a bomb reaches its limit quickly. Code runs only through HTTP or
the WebSocket; the verdicts also come from outside the sandbox: ``docker inspect``/``top``,
the container's cgroup files, the host's file system, the gateway process's memory.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import docker
import httpx
import psutil
import pytest

from tests.conftest import GatewayProcess, containers_of, make_gateway

T = TypeVar("T")

LIMITS = {"memory": "512m", "pids": "128", "workspace_size": "64m", "tmp_size": "32m"}
GRACE_S = 2.0
"""The product's default wait after an interrupt: at 1 s, a gVisor sandbox on a loaded machine
was restarted before its Python loop took the KeyboardInterrupt (seen twice in CI's gVisor leg)."""
REPORT = """
def report(value):
    import json
    text = json.dumps(value)
    if len(text) < 4000:
        print(text)
    else:
        with open('/home/user/.report.json', 'w') as f:
            f.write(text)
"""
RESTART_BUDGET_S = 25.0
"""Beyond timeout + grace: killing every process and starting a fresh kernel, on a busy host."""


@dataclass
class Hostile:
    """The gateway under attack, with the means to look at its sandboxes from the host."""

    gateway: GatewayProcess
    docker: docker.DockerClient
    host_canary: str
    clients: dict[str, httpx.Client] = field(default_factory=dict)

    def client(self, tenant: str = "alpha") -> httpx.Client:
        if tenant not in self.clients:
            self.clients[tenant] = httpx.Client(base_url=self.gateway.url, timeout=180,
                                                headers=self.gateway.headers(tenant))
        return self.clients[tenant]

    # -- the public API ----------------------------------------------------------------------

    def new_session(self, tenant: str = "alpha", **body: Any) -> str:
        answer = self.client(tenant).post("/v1/sessions", json=body)
        assert answer.status_code == 201, answer.text
        return str(answer.json()["id"])

    def delete(self, sid: str, tenant: str = "alpha") -> None:
        answer = self.client(tenant).delete(f"/v1/sessions/{sid}")
        assert answer.status_code in (204, 404), answer.text

    def run(self, sid: str, code: str, timeout_s: float = 10, tenant: str = "alpha",
            ) -> dict[str, Any]:
        """Execute over HTTP; the answer must come within the time limit, contained."""
        started = time.monotonic()
        answer = self.client(tenant).post(f"/v1/sessions/{sid}/execute",
                                          json={"code": code, "timeout_s": timeout_s})
        elapsed = time.monotonic() - started
        assert answer.status_code == 200, answer.text[:2000]
        result: dict[str, Any] = answer.json()
        result["_elapsed"] = elapsed
        assert elapsed < timeout_s + GRACE_S + RESTART_BUDGET_S, (elapsed, brief(result))
        assert result["status"] in ("ok", "error", "timeout", "interrupted", "died"), result
        return result

    def ok(self, sid: str, code: str, timeout_s: float = 30, tenant: str = "alpha") -> str:
        """Run code that must succeed; its stdout."""
        result = self.run(sid, code, timeout_s, tenant)
        assert result["status"] == "ok", brief(result)
        return str(result["stdout"])

    def json_of(self, sid: str, code: str, timeout_s: float = 30, tenant: str = "alpha") -> Any:
        """Run code that ends with ``report(value)``; that value.

        A short report comes back on stdout; a long one (over the line cap) in a workspace
        file, fetched through the files API.
        """
        stdout = self.ok(sid, REPORT + code, timeout_s, tenant)
        if stdout.strip():
            return json.loads(stdout.strip().splitlines()[-1])
        answer = self.client(tenant).get(f"/v1/sessions/{sid}/files/.report.json")
        assert answer.status_code == 200, answer.text
        return answer.json()

    def usable(self, sid: str, tenant: str = "alpha") -> None:
        """The session answers a fresh execution correctly (after whatever happened)."""
        token = secrets.token_hex(8)
        assert self.ok(sid, f"print('{token}')", tenant=tenant) == f"{token}\n"
        status = self.client(tenant).get(f"/v1/sessions/{sid}").json()["status"]
        assert status == "idle", status

    def restart(self, sid: str, tenant: str = "alpha") -> None:
        answer = self.client(tenant).post(f"/v1/sessions/{sid}/restart")
        assert answer.status_code == 200, answer.text

    def healthz_ms(self) -> float:
        started = time.perf_counter()
        answer = self.client().get("/healthz")
        assert answer.status_code == 200
        return (time.perf_counter() - started) * 1000

    # -- the host's view ---------------------------------------------------------------------

    def sandbox(self, sid: str) -> dict[str, Any]:
        """The session's sandbox as the gateway recorded it (its SQLite store, read-only)."""
        db = sqlite3.connect(f"file:{self.gateway.state_dir / 'replgate.db'}?mode=ro", uri=True)
        try:
            row = db.execute("SELECT sandbox FROM sessions WHERE id = ?", (sid,)).fetchone()
        finally:
            db.close()
        assert row is not None and row[0], f"no sandbox recorded for {sid}"
        info: dict[str, Any] = json.loads(row[0])
        return info

    def container(self, sid: str) -> Any:
        """The session's container, by its name (stable when the container is replaced; under
        gVisor a hard stop replaces it, so a replacement being made is waited for)."""
        name = f"replgate-{self.sandbox(sid)['sandbox_id']}"
        deadline = time.monotonic() + RESTART_BUDGET_S
        while True:
            try:
                return self.docker.containers.get(name)
            except docker.errors.NotFound:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def runtime(self, sid: str) -> str:
        """The OCI runtime the engine runs the session's container with (runc or runsc)."""
        return str(self.container(sid).attrs["HostConfig"]["Runtime"])

    def host_processes(self, sid: str) -> list[str]:
        """The command lines of every process in the session's container: from ``docker top``
        under runc; under gVisor, whose processes are not the host's, the process list comes
        from ``runsc ps`` on the host (the sentry's own table) and each one's command line
        from the sentry's ``/proc`` (``docker top`` would match gVisor's pids to host ones)."""
        container = self.container(sid)
        if container.attrs["HostConfig"]["Runtime"] != "runsc":
            top = container.top()
            column = top["Titles"].index("CMD")
            return [row[column] for row in top.get("Processes") or []]
        return self._while_running(sid, self._gvisor_processes)

    @staticmethod
    def _gvisor_processes(container: Any) -> list[str]:
        pids = runsc_pids(container)
        script = "; ".join(f"tr '\\0' ' ' < /proc/{pid}/cmdline 2>/dev/null; echo" for pid in pids)
        output = container.exec_run(["/bin/sh", "-c", script], user="1000:1000").output
        return [line.strip() for line in output.decode(errors="replace").splitlines()][:len(pids)]

    def _while_running(self, sid: str, read: Callable[[Any], T]) -> T:
        """``read(container)`` of a gVisor sandbox, again if the sandbox stopped meanwhile: a
        swarm makes the gateway replace it (same name), which may happen while it is read."""
        deadline = time.monotonic() + RESTART_BUDGET_S
        while True:
            try:
                return read(self.container(sid))
            except (OSError, subprocess.CalledProcessError, docker.errors.APIError,
                    StopIteration):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def pids_limit(self, sid: str) -> int:
        """The sandbox's process limit as the engine enforces it: the pids cgroup under runc,
        RLIMIT_NPROC inside gVisor (whose host cgroup holds the sentry, with room to spare)."""
        container = self.container(sid)
        if container.attrs["HostConfig"]["Runtime"] != "runsc":
            return int(self.cgroup_value(sid, "pids", "pids.max"))
        limits = {u["Name"]: u["Hard"] for u in container.attrs["HostConfig"]["Ulimits"]}
        return int(limits["nproc"])

    def pids_current(self, sid: str) -> int:
        """Processes and threads in the sandbox now (gVisor: its processes, from runsc ps)."""
        container = self.container(sid)
        if container.attrs["HostConfig"]["Runtime"] != "runsc":
            return int(self.cgroup_value(sid, "pids", "pids.current"))
        return len(self._while_running(sid, runsc_pids))

    def cgroup_value(self, sid: str, controller: str, name: str) -> str:
        container = self.container(sid)
        container.reload()
        pid = container.attrs["State"]["Pid"]
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controller in controllers.split(","):
                return (Path("/sys/fs/cgroup") / controller / path.lstrip("/") / name).read_text()
        raise AssertionError(f"no {controller} cgroup for {sid}")

    def gateway_rss(self) -> int:
        assert self.gateway.process is not None
        return int(psutil.Process(self.gateway.process.pid).memory_info().rss)

    def log(self) -> str:
        return self.gateway.log_path.read_text(errors="replace")


def runsc_pids(container: Any) -> list[int]:
    """The pids (gVisor's numbering) of a gVisor container's processes, from ``runsc ps`` run
    on the host with the state root the engine gave the sandbox."""
    container.reload()
    sandbox_pid = container.attrs["State"]["Pid"]
    if not sandbox_pid:
        raise ProcessLookupError(f"{container.name} is not running")
    arguments = Path(f"/proc/{sandbox_pid}/cmdline").read_bytes().split(b"\0")
    root = next(a[7:].decode() for a in arguments if a.startswith(b"--root="))
    listing = subprocess.run(
        [str(Path(f"/proc/{sandbox_pid}/exe").readlink()), f"--root={root}", "ps",
         "--format=json", container.id], capture_output=True, text=True, timeout=30, check=True)
    return [int(pid) for pid in json.loads(listing.stdout)]


def brief(result: dict[str, Any]) -> dict[str, Any]:
    """An execution result with its long texts cut, for assertion messages."""
    short = dict(result)
    for key in ("stdout", "stderr"):
        text = short.get(key) or ""
        if len(text) > 600:
            short[key] = f"{text[:300]}...<{len(text)} chars>...{text[-300:]}"
    if short.get("error"):
        error = dict(short["error"])
        error["evalue"] = str(error.get("evalue"))[:300]
        error["traceback"] = f"<{len(error.get('traceback') or [])} lines>"
        short["error"] = error
    short["outputs"] = f"<{len(short.get('outputs') or [])} outputs>"
    return short


@pytest.fixture(scope="session")
def hostile(docker_client: docker.DockerClient) -> Iterator[Hostile]:
    """A gateway with small limits and a secret in its own environment, for hostile code."""
    gateway = make_gateway(**LIMITS, max_kernels="8", min_idle="2",
                           interrupt_grace_s=str(GRACE_S), state_min_free="64m")
    canary = f"host-canary-{secrets.token_hex(12)}"
    gateway.env["HOST_CANARY_SECRET"] = canary
    gateway.start()
    attack = Hostile(gateway, docker_client, canary)
    try:
        yield attack
    finally:
        for client in attack.clients.values():
            client.close()
        gateway.stop()
        left = containers_of(docker_client, gateway.owner)
        for cid in left:
            docker_client.api.remove_container(cid, force=True)
        assert not left, f"the hostile gateway left containers behind: {left}"


@pytest.fixture
def sid(hostile: Hostile) -> Iterator[str]:
    """A fresh session of tenant alpha for one test, deleted after it."""
    session_id = hostile.new_session()
    yield session_id
    hostile.delete(session_id)
