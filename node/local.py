"""``replgate cluster``: many machines on one, to try them (``./run.sh cluster``).

Nodes and gateways are the real commands (``replgate node``, ``replgate serve``) in processes
of their own, each with its own state directory under one folder, on one PostgreSQL database,
talking over TCP with mutual TLS (certificates made under the folder). Nothing is shared but
the database and the Docker engine, as on separate machines.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from common.keys import generate_api_key
from node.tls import ClusterCerts, client_context, make_cluster_certs


@dataclass
class Member:
    """One process of the cluster: a node or a gateway."""

    name: str
    command: list[str]
    env: dict[str, str]
    log_path: Path
    ready_url: str
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command, env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None:
            stop_group(self.process, sig)
        self.process = None

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]


class LocalCluster:
    """``nodes`` nodes and ``gateways`` gateways on this machine (see the module's docstring)."""

    def __init__(self, folder: Path, database_url: str, *, nodes: int = 3, gateways: int = 2,
                 gateway_port: int = 8000, node_port: int = 7070,
                 env: dict[str, str] | None = None, name: str = "") -> None:
        """``name``: a prefix of the nodes' ids (their containers' owner label), to tell
        clusters of one engine apart."""
        self.folder = folder
        self.name = name
        self.database_url = database_url
        self.api_key = generate_api_key()
        self.certs: ClusterCerts = make_cluster_certs(folder / "certs")
        base = {k: v for k, v in os.environ.items() if not k.startswith("REPLGATE_")}
        base.update(env or {})
        base["REPLGATE_DATABASE_URL"] = database_url
        self.nodes = [self._node(i, node_port + i - 1, base) for i in range(1, nodes + 1)]
        self.gateways = [self._gateway(i, gateway_port + i - 1, base)
                         for i in range(1, gateways + 1)]

    def _node(self, index: int, port: int, base: dict[str, str]) -> Member:
        name = f"{self.name}node-{index}"
        state = self.folder / name
        env = {**base, "REPLGATE_STATE_DIR": str(state), "REPLGATE_TLS_CA": str(self.certs.ca),
               "REPLGATE_TLS_CERT": str(self.certs.node_cert),
               "REPLGATE_TLS_KEY": str(self.certs.node_key)}
        return Member(name, [sys.executable, "-m", "gateway.cli", "node", "--id", name,
                             "--advertise", f"127.0.0.1:{port}",
                             "--listen", f"127.0.0.1:{port}"],
                      env, self.folder / f"{name}.log", f"https://127.0.0.1:{port}/healthz")

    def _gateway(self, index: int, port: int, base: dict[str, str]) -> Member:
        name = f"gateway-{index}"
        env = {**base, "REPLGATE_STATE_DIR": str(self.folder / name),
               "REPLGATE_API_KEYS": f"default:{self.api_key}",
               "REPLGATE_TLS_CA": str(self.certs.ca),
               "REPLGATE_TLS_CERT": str(self.certs.gateway_cert),
               "REPLGATE_TLS_KEY": str(self.certs.gateway_key)}
        return Member(name, [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)],
                      env, self.folder / f"{name}.log", f"http://127.0.0.1:{port}/healthz")

    @property
    def urls(self) -> list[str]:
        return [g.ready_url.removesuffix("/healthz") for g in self.gateways]

    def start(self, timeout_s: float = 180.0) -> None:
        """Nodes first (each answering over mutual TLS), then the gateways.

        Raises RuntimeError, before starting anything, when a port of the cluster is taken:
        the process there (a gateway of ``./run.sh serve``, say) would answer the readiness
        check in place of the member that could not listen.
        """
        for member in (*self.nodes, *self.gateways):
            port = int(member.ready_url.rsplit(":", 1)[1].split("/", 1)[0])
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    raise RuntimeError(
                        f"port {port} of {member.name} is taken (a gateway of ./run.sh serve "
                        "still running?): stop what listens there, or pass --port/--node-port"
                    ) from None
        self.folder.mkdir(parents=True, exist_ok=True)
        for group in (self.nodes, self.gateways):
            for member in group:
                member.start()
            for member in group:
                self._wait(member, timeout_s)

    def _wait(self, member: Member, timeout_s: float) -> None:
        tls = client_context(self.certs.gateway_cert, self.certs.gateway_key, self.certs.ca)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if member.process is None or member.process.poll() is not None:
                raise RuntimeError(f"{member.name} exited:\n{member.log_tail()}")
            try:
                if httpx.get(member.ready_url, verify=tls, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"{member.name} not ready in {timeout_s:g}s:\n{member.log_tail()}")

    def stop(self) -> None:
        """Gateways first, then the nodes (which remove their sandboxes as they stop)."""
        for group in (self.gateways, self.nodes):
            stop_groups(member.process for member in group if member.process is not None)
            for member in group:
                member.process = None



def stop_group(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """Stop a process started in a session of its own, and its children: ``sig`` to the
    group, SIGKILL after 30 s."""
    stop_groups([process], sig)


def stop_groups(processes: Iterable[subprocess.Popen[bytes]],
                sig: int = signal.SIGTERM) -> None:
    """Stop several such processes at once (nodes removing their sandboxes stop side by side,
    not one after another): ``sig`` to every group, SIGKILL to those still running 30 s
    later."""
    running = [process for process in processes if process.poll() is None]
    for process in running:
        with contextlib.suppress(ProcessLookupError):  # it ended since
            os.killpg(process.pid, sig)
    deadline = time.monotonic() + 30
    for process in running:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
