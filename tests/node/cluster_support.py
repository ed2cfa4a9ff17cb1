"""A local cluster for tests: three ``replgate node`` processes and two ``replgate serve``
gateways on one PostgreSQL database, talking over TCP with mutual TLS only.

Each node has its own state directory and container owner label; they share nothing but the
database (and the Docker engine, as nodes on one machine do).
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import httpx
import psycopg

from node.local import stop_group, stop_groups
from node.tls import ClusterCerts, make_cluster_certs
from tests.conftest import (
    REPO,
    TEMPLATE_DIR,
    TEST_RUNTIME,
    GatewayProcess,
    containers_of,
    create_database,
    drop_database,
    free_port,
    make_gateway,
    running_gateway,
    unmount_all,
)

NODE_TIMEOUT_S = 4.0
"""Short, so a killed node is declared down within the test (beats every third of it)."""
ADMIN_KEY = f"rg_admin_{secrets.token_hex(8)}"
"""The operators' key of the cluster's gateways (REPLGATE_ADMIN_KEYS)."""


@dataclass
class NodeProcess:
    """A ``replgate node`` subprocess with its own state directory."""

    node_id: str
    port: int
    env: dict[str, str]
    state_dir: Path
    process: subprocess.Popen[bytes] | None = None
    log_path: Path = field(default_factory=Path)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gateway.cli", "node", "--advertise", self.address,
                 "--listen", self.address, "--id", self.node_id],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                start_new_session=True)

    def wait_registered(self, database_url: str, timeout_s: float = 120.0) -> None:
        """Until the node's row says up with a warm kernel (its first heartbeat counted it)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"node {self.node_id} exited: {self.log()}")
            with psycopg.connect(database_url, autocommit=True) as db:
                try:
                    row = db.execute("SELECT state, kernels FROM nodes WHERE id = %s",
                                     (self.node_id,)).fetchone()
                except psycopg.errors.UndefinedTable:  # the first node's migration is running
                    row = None
            if row is not None and row[0] == "up" and row[1] >= 1:
                return
            time.sleep(0.3)
        raise RuntimeError(f"node {self.node_id} not registered in {timeout_s}s: {self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None:
            stop_group(self.process, sig)
        self.process = None


@dataclass
class Cluster:
    database_url: str
    certs: ClusterCerts
    nodes: list[NodeProcess]
    gateways: list[GatewayProcess]


def _tls_env(certs: ClusterCerts, role: str) -> dict[str, str]:
    cert, key = ((certs.node_cert, certs.node_key) if role == "node"
                 else (certs.gateway_cert, certs.gateway_key))
    return {"REPLGATE_TLS_CA": str(certs.ca), "REPLGATE_TLS_CERT": str(cert),
            "REPLGATE_TLS_KEY": str(key)}


def make_node(node_id: str, database_url: str, certs: ClusterCerts,
              extra_env: dict[str, str] | None = None) -> NodeProcess:
    state_dir = Path(tempfile.mkdtemp(prefix=f"rg-{node_id}-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPLGATE_")}
    env.update({
        "REPLGATE_RUNTIME": TEST_RUNTIME, "REPLGATE_STATE_DIR": str(state_dir),
        "REPLGATE_DATABASE_URL": database_url, "REPLGATE_NODE_TIMEOUT_S": str(NODE_TIMEOUT_S),
        "REPLGATE_MIN_IDLE": "1", "REPLGATE_MAX_KERNELS": "4", "REPLGATE_WORKSPACE_SIZE": "64m",
        "REPLGATE_INTERRUPT_GRACE_S": "2.0", "REPLGATE_KEEP_SESSIONS_ON_STOP": "false",
        "REPLGATE_TEMPLATE_DIR": str(TEMPLATE_DIR), "REPLGATE_LOG_LEVEL": "info",
        **_tls_env(certs, "node"), **(extra_env or {}),
    })
    return NodeProcess(node_id=node_id, port=free_port(), env=env, state_dir=state_dir,
                       log_path=state_dir.with_suffix(".log"))


@contextmanager
def running_cluster(docker_client: docker.DockerClient, nodes: int = 3, gateways: int = 2,
                    bundle_store: str | None = None,
                    store_env: dict[str, str] | None = None,
                    gateway_settings: dict[str, str] | None = None) -> Iterator[Cluster]:
    """The cluster, started; afterwards no container or mount of it remains.

    ``bundle_store``: where the nodes keep paused sessions (``REPLGATE_BUNDLE_STORE``, with a
    bundle key made for the cluster), ``store_env`` what the nodes need to reach it (the
    ``AWS_*`` variables of an S3 server); ``gateway_settings`` more settings of the gateways
    (``{"policy_file": ...}`` for ``REPLGATE_POLICY_FILE``)."""
    database_url = create_database()
    certs_dir = Path(tempfile.mkdtemp(prefix="rg-certs-", dir="/tmp"))
    certs = make_cluster_certs(certs_dir)
    bundles = {} if bundle_store is None else {
        "REPLGATE_BUNDLE_STORE": bundle_store, **(store_env or {}),
        "REPLGATE_BUNDLE_KEY": base64.b64encode(os.urandom(32)).decode()}
    members = [make_node(f"node-{i}-{os.getpid()}", database_url, certs, bundles)
               for i in range(1, nodes + 1)]
    try:
        for member in members:
            member.start()
        for member in members:
            member.wait_registered(database_url)
        with ExitStack() as stack:
            processes = []
            for _ in range(gateways):
                stores = {} if bundle_store is None else {"bundle_store": bundle_store}
                process = make_gateway(database_url=database_url, local_node="false",
                                       node_timeout_s=str(NODE_TIMEOUT_S), admin_keys=ADMIN_KEY,
                                       **stores, **(gateway_settings or {}),
                                       **{k.removeprefix("REPLGATE_").lower(): v
                                          for k, v in _tls_env(certs, "gateway").items()})
                process.warm = False
                processes.append(stack.enter_context(running_gateway(docker_client, process)))
            yield Cluster(database_url, certs, members, processes)
    finally:
        left: list[str] = []
        mounted: list[str] = []
        stop_groups(member.process for member in members if member.process is not None)
        for member in members:
            member.process = None
            found = containers_of(docker_client, member.node_id)
            left += found
            for container_id in found:
                docker_client.api.remove_container(container_id, force=True, v=True)
            mounted += unmount_all(member.state_dir)
            shutil.rmtree(member.state_dir, ignore_errors=True)
        shutil.rmtree(certs_dir, ignore_errors=True)
        drop_database(database_url)
    assert not left, f"the nodes left containers behind: {left}"
    assert not mounted, f"the nodes left mounts behind: {mounted}"


def gateway_client(gateway: GatewayProcess, key_of: GatewayProcess | None = None, *,
                   key: str | None = None) -> httpx.AsyncClient:
    """A client of ``gateway`` with ``key``, or else tenant alpha's key as ``key_of`` made it
    (the keys are shared state: any gateway's key opens every gateway)."""
    headers = {"Authorization": f"Bearer {key}"} if key else (key_of or gateway).headers()
    return httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=120)


async def create_session(client: httpx.AsyncClient) -> dict[str, Any]:
    answer = await client.post("/v1/sessions", json={})
    assert answer.status_code == 201, answer.text
    created: dict[str, Any] = answer.json()
    return created


async def execute(client: httpx.AsyncClient, sid: str, code: str) -> dict[str, Any]:
    answer = await client.post(f"/v1/sessions/{sid}/execute", json={"code": code})
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result
