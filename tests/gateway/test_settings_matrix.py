"""Each setting of docs/configuration.md that selects a code path, with each value it documents:
`replgate serve` (and `replgate node`) started with it answers and works on that path (a
session, a pause, a saved snapshot in the bundle store); a value that cannot work stops the
command at start, status 2, with one line naming the setting and what to do, never a traceback.

The valid values are spread over a few gateways started side by side (each value on at least
one of them), and the refusals run side by side too: the module costs about as long as its
slowest gateway.
"""

from __future__ import annotations

import asyncio
import base64
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import docker
import httpx
import pytest

from kernel_pool.bundles import Bundles
from kernel_pool.config import BundleSettings
from node.tls import ClusterCerts, make_cluster_certs
from tests.conftest import (
    CLIENT_TIMEOUT_S,
    REPO,
    TEMPLATE_DIR,
    TEST_POSTGRES,
    GatewayProcess,
    create_database,
    drop_database,
    free_port,
    make_gateway,
    running_gateway,
    unmount_all,
)
from tests.kernel_pool.bundles.seaweed_support import BUCKET, SeaweedFS, running_seaweedfs
from tests.node.cluster_support import NodeProcess, make_node

BUNDLE_KEY = base64.b64encode(os.urandom(32)).decode()
UNREACHABLE = "postgresql://replgate:secret@127.0.0.1:1/replgate"
"""A PostgreSQL URL nothing answers (port 1): nothing is ever opened on it."""
NO_SUCH_DATABASE = urlunsplit(urlsplit(TEST_POSTGRES)._replace(
    path=f"/replgate_matrix_missing_{secrets.token_hex(4)}"))
"""The test server, a database it does not have: the connection is refused."""


@dataclass(frozen=True)
class Valid:
    """A gateway's settings and what its session's pause is to keep."""

    settings: dict[str, str]
    paused_with: str
    store: str | None = None
    """``file`` or ``s3``: a saved snapshot must land there (and come back from it)."""
    database: str | None = None
    """Unset: SQLite in the state folder; ``sqlite`` (a URL) or ``postgresql``."""


VALID: dict[str, Valid] = {
    # REPLGATE_DATABASE_URL and REPLGATE_BUNDLE_STORE unset, REPLGATE_RUNTIME and
    # REPLGATE_PAUSE_WITH at their defaults (runc, auto).
    "defaults": Valid({}, paused_with="variables"),
    # sqlite:////path, file:///path, gvisor, variables.
    "sqlite-file-gvisor-variables": Valid(
        {"runtime": "gvisor", "pause_with": "variables"}, paused_with="variables",
        store="file", database="sqlite"),
    # postgresql://, s3:// (SeaweedFS), runc, memory, no kernel templates, huge pages.
    "postgresql-s3-runc-memory": Valid(
        {"runtime": "runc", "pause_with": "memory", "kernel_templates": "false",
         "limits__huge_pages": "true", "bundle_key": BUNDLE_KEY}, paused_with="memory",
        store="s3", database="postgresql"),
}
THP_ENABLED = ("print(next(line.split()[1] for line in open('/proc/self/status') "
               "if line.startswith('THP_enabled:')))")
"""What the kernel's process says of its transparent huge pages: 0 when turned off for it."""
GVISOR_RELEASE = "4.4.0"
"""The kernel release gVisor's own kernel reports (the host's is newer)."""


@pytest.fixture(scope="module")
def seaweedfs() -> Iterator[SeaweedFS]:
    with running_seaweedfs() as server:
        yield server


@pytest.fixture(scope="module")
def certs() -> Iterator[ClusterCerts]:
    folder = Path(tempfile.mkdtemp(prefix="rg-matrix-certs-", dir="/tmp"))
    yield make_cluster_certs(folder)
    shutil.rmtree(folder, ignore_errors=True)


def _gateway_of(valid: Valid, folder: Path, seaweedfs: SeaweedFS) -> GatewayProcess:
    settings = dict(valid.settings)
    if valid.store == "file":
        settings["bundle_store"] = (folder / "bundles").as_uri()
    elif valid.store == "s3":
        settings["bundle_store"] = f"s3://{BUCKET}/matrix-{secrets.token_hex(4)}"
    if valid.database == "postgresql":
        settings["database_url"] = create_database()
    elif valid.database == "sqlite":
        settings["database_url"] = f"sqlite:///{folder / 'elsewhere.db'}"
    process = make_gateway(**settings)
    if valid.database != "postgresql":  # where sessions run follows the database, as written
        process.env.pop("REPLGATE_LOCAL_NODE")
    if valid.database is None:  # (the PostgreSQL leg's own database: not this value)
        if process.own_database and process.database_url is not None:
            drop_database(process.database_url)
        process.env.pop("REPLGATE_DATABASE_URL", None)
        process.env.pop("REPLGATE_RUNTIME", None)
        process.own_database = False
    else:
        process.own_database = valid.database == "postgresql"
    if valid.store == "s3":
        process.env.update(seaweedfs.aws_env())
    return process


@pytest.fixture(scope="module")
def gateways(docker_client: docker.DockerClient, seaweedfs: SeaweedFS,
             refusals: dict[str, Future[subprocess.CompletedProcess[str]]],
             node: tuple[NodeProcess, str]) -> Iterator[dict[str, GatewayProcess]]:
    """Every valid combination's gateway, started side by side, ready (a warm kernel); the
    refusals and the node start meanwhile."""
    folder = Path(tempfile.mkdtemp(prefix="rg-matrix-", dir="/tmp"))
    processes = {name: _gateway_of(valid, folder / name, seaweedfs)
                 for name, valid in VALID.items()}
    try:
        with ExitStack() as stack, ThreadPoolExecutor(len(processes)) as pool:
            started = [pool.submit(stack.enter_context, running_gateway(docker_client, process))
                       for process in processes.values()]
            for future in started:
                future.result()
            yield processes
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _stored(gateway: GatewayProcess, tenant: str) -> list[str]:
    """The bundles the gateway's store holds for ``tenant``, read as any node would."""
    bundles = Bundles.from_settings(BundleSettings(
        store=gateway.env["REPLGATE_BUNDLE_STORE"], key=gateway.env.get("REPLGATE_BUNDLE_KEY")))
    assert bundles is not None
    return asyncio.run(bundles.list(tenant))


def _printed(client: httpx.Client, sid: str, code: str) -> str:
    answer = client.post(f"/v1/sessions/{sid}/execute", json={"code": code})
    assert answer.status_code == 200 and answer.json()["status"] == "ok", answer.text
    return str(answer.json()["stdout"]).strip()


@pytest.mark.parametrize("name", list(VALID))
def test_each_documented_value_starts_and_works(name: str, gateways: dict[str, GatewayProcess],
                                                seaweedfs: SeaweedFS,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    valid, gateway = VALID[name], gateways[name]
    with httpx.Client(base_url=gateway.url, headers=gateway.headers(),
                      timeout=CLIENT_TIMEOUT_S) as client:
        assert client.get("/healthz").json()["status"] == "ok"
        session = client.post("/v1/sessions")
        assert session.status_code == 201, session.text
        sid = session.json()["id"]
        # the runtime asked for is the one the sandbox runs on
        release = _printed(client, sid, "import platform; x = 41; print(platform.release())")
        assert (release == GVISOR_RELEASE) == (valid.settings.get("runtime") == "gvisor"), release
        huge = "1" if valid.settings.get("limits__huge_pages") else "0"
        if valid.settings.get("runtime") != "gvisor":  # (its kernel has no such flag to show)
            assert _printed(client, sid, THP_ENABLED) == huge
        paused = client.post(f"/v1/sessions/{sid}/pause")
        assert paused.status_code == 200, paused.text
        assert paused.json()["paused_with"] == valid.paused_with, paused.json()
        assert _printed(client, sid, "print(x + 1)") == "42"
        if valid.settings.get("runtime") != "gvisor":  # a memory resume keeps it as it was
            assert _printed(client, sid, THP_ENABLED) == huge
        if valid.store is not None:
            saved = client.post(f"/v1/sessions/{sid}/snapshots", json={"name": "matrix"})
            assert saved.status_code == 201, saved.text
            if valid.store == "s3":
                for variable, value in seaweedfs.aws_env().items():
                    monkeypatch.setenv(variable, value)
            assert _stored(gateway, "alpha"), "the snapshot is not in the bundle store"
            made = client.post(f"/v1/snapshots/{saved.json()['id']}/sessions")
            assert made.status_code == 201, made.text
            assert _printed(client, made.json()["id"], "print(x + 1)") == "42"
            client.delete(f"/v1/sessions/{made.json()['id']}")
        client.delete(f"/v1/sessions/{sid}")


@pytest.fixture(scope="module")
def node(certs: ClusterCerts) -> Iterator[tuple[NodeProcess, str]]:
    """A ``replgate node`` with a ``file://`` bundle store on a database of its own, started
    (not yet registered) and its database's URL."""
    database_url = create_database()
    folder = Path(tempfile.mkdtemp(prefix="rg-matrix-node-", dir="/tmp"))
    started = make_node(f"matrix-{secrets.token_hex(3)}", database_url, certs,
                        {"REPLGATE_BUNDLE_STORE": (folder / "bundles").as_uri(),
                         "REPLGATE_PAUSE_WITH": "variables"})
    try:
        started.start()
        yield started, database_url
    finally:
        started.stop()
        unmount_all(started.state_dir)
        shutil.rmtree(started.state_dir, ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)
        drop_database(database_url)


def test_a_node_starts_with_a_file_bundle_store(node: tuple[NodeProcess, str],
                                                certs: ClusterCerts) -> None:
    started, database_url = node
    started.wait_registered(database_url)
    # Its id taken by a second node: refused in one line, without a traceback in the log.
    twin = make_node(started.node_id, database_url, certs)
    twin.start()
    try:
        assert twin.process is not None and twin.process.wait(timeout=REFUSAL_TIMEOUT_S) == 2
    finally:
        twin.stop()
        shutil.rmtree(twin.state_dir, ignore_errors=True)
    lines = twin.log().strip().splitlines()
    assert "Traceback" not in twin.log() and not any(" ERROR " in line for line in lines)
    assert lines[-1].startswith(f"replgate: node id {started.node_id!r} is held by a live node")


REFUSAL_TIMEOUT_S = 180
"""A refusal takes seconds; on a machine as loaded as CI's gVisor leg, with the gateways
starting beside, a full import took over a minute."""


@dataclass(frozen=True)
class Refused:
    env: dict[str, str]
    says: str
    """The variable the one line must name."""
    command: str = "serve"
    status: int = 2
    """1 where what is asked for cannot be taken (the state directory, the address)."""


REFUSED: dict[str, Refused] = {
    "database-url-unknown-scheme": Refused(
        {"DATABASE_URL": "mysql://replgate:secret@127.0.0.1/replgate"}, "REPLGATE_DATABASE_URL"),
    "database-url-bare-path": Refused({"DATABASE_URL": "/srv/replgate.db"},
                                      "REPLGATE_DATABASE_URL"),
    "database-url-malformed": Refused({"DATABASE_URL": "postgresql://replgate@:port/x"},
                                      "REPLGATE_DATABASE_URL"),
    "database-unreachable": Refused({"DATABASE_URL": UNREACHABLE, "LOCAL_NODE": "true"},
                                    "REPLGATE_DATABASE_URL"),
    "database-missing": Refused({"DATABASE_URL": NO_SUCH_DATABASE, "LOCAL_NODE": "true"},
                                "REPLGATE_DATABASE_URL"),
    "sqlite-folder-impossible": Refused({"DATABASE_URL": "sqlite:////proc/replgate/x.db"},
                                        "REPLGATE_DATABASE_URL"),
    "database-without-tls-or-local-node": Refused({"DATABASE_URL": UNREACHABLE},
                                                  "REPLGATE_LOCAL_NODE"),
    "bundle-store-unknown-scheme": Refused({"BUNDLE_STORE": "ftp://files/bundles"},
                                           "REPLGATE_BUNDLE_STORE"),
    "bundle-store-bare-path": Refused({"BUNDLE_STORE": "/srv/bundles"}, "REPLGATE_BUNDLE_STORE"),
    "bundle-store-s3-no-bucket": Refused({"BUNDLE_STORE": "s3:///prefix",
                                          "BUNDLE_KEY": BUNDLE_KEY}, "REPLGATE_BUNDLE_STORE"),
    "bundle-store-s3-no-key": Refused({"BUNDLE_STORE": "s3://bundles/x"}, "REPLGATE_BUNDLE_KEY"),
    "bundle-key-not-base64": Refused({"BUNDLE_STORE": "file:///tmp/b", "BUNDLE_KEY": "not!key"},
                                     "REPLGATE_BUNDLE_KEY"),
    "bundle-key-short": Refused({"BUNDLE_KEY": base64.b64encode(b"short").decode()},
                                "REPLGATE_BUNDLE_KEY"),
    "runtime-unknown": Refused({"RUNTIME": "kata"}, "REPLGATE_RUNTIME"),
    "runtime-nested-unknown": Refused({"LIMITS__RUNTIME": "runsc"}, "REPLGATE_LIMITS__RUNTIME"),
    "pause-with-unknown": Refused({"PAUSE_WITH": "disk"}, "REPLGATE_PAUSE_WITH"),
    "pause-with-nested-unknown": Refused({"POOL__PAUSE_WITH": "criu"},
                                         "REPLGATE_POOL__PAUSE_WITH"),
    "pause-after-not-a-duration": Refused({"PAUSE_AFTER_S": "10m"}, "REPLGATE_PAUSE_AFTER_S"),
    "memory-not-a-size": Refused({"MEMORY": "lots"}, "REPLGATE_MEMORY"),
    "snapshot-budget-not-a-size": Refused({"SNAPSHOT_BUDGET": "twenty gigs"},
                                          "REPLGATE_SNAPSHOT_BUDGET"),
    "node-timeout-zero": Refused({"NODE_TIMEOUT_S": "0"}, "REPLGATE_NODE_TIMEOUT_S"),
    "local-node-not-a-boolean": Refused({"LOCAL_NODE": "maybe"}, "REPLGATE_LOCAL_NODE"),
    "kernel-templates-not-a-boolean": Refused({"KERNEL_TEMPLATES": "sometimes"},
                                              "REPLGATE_KERNEL_TEMPLATES"),
    "tls-incomplete": Refused({"TLS_CA": "/etc/hostname"}, "REPLGATE_TLS_CERT"),
    "tls-missing-files": Refused({"TLS_CA": "/nonexistent/ca.pem",
                                  "TLS_CERT": "/nonexistent/cert.pem",
                                  "TLS_KEY": "/nonexistent/key.pem"}, "REPLGATE_TLS_CA"),
    "log-level-unknown": Refused({"LOG_LEVEL": "loud"}, "REPLGATE_LOG_LEVEL"),
    "allowed-origins-not-json": Refused({"ALLOWED_ORIGINS": "https://a.example"},
                                        "REPLGATE_ALLOWED_ORIGINS"),
    "api-keys-without-tenant": Refused({"API_KEYS": "secret-key-of-nobody"},
                                       "REPLGATE_API_KEYS"),
    "e2b-domain-not-a-domain": Refused({"E2B_DOMAIN": "localhost"}, "REPLGATE_E2B_DOMAIN"),
    "state-dir-impossible": Refused({"STATE_DIR": "/proc/replgate"}, "REPLGATE_STATE_DIR",
                                    status=1),
    "host-not-an-address": Refused({"HOST": "gateway.invalid"}, "REPLGATE_HOST", status=1),
    "policy-file-missing": Refused({"POLICY_FILE": "/nonexistent/policy.toml"},
                                   "REPLGATE_POLICY_FILE"),
    "node-pause-with-unknown": Refused({"PAUSE_WITH": "disk"}, "REPLGATE_PAUSE_WITH", "node"),
    "node-without-database": Refused({}, "REPLGATE_DATABASE_URL", "node"),
    "node-database-unreachable": Refused({"DATABASE_URL": UNREACHABLE}, "REPLGATE_DATABASE_URL",
                                         "node"),
    "audit-database-unreachable": Refused({"DATABASE_URL": UNREACHABLE},
                                          "REPLGATE_DATABASE_URL", "audit"),
}


def _refuse(refused: Refused, certs: ClusterCerts) -> subprocess.CompletedProcess[str]:
    state_dir = Path(tempfile.mkdtemp(prefix="rg-refused-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REPLGATE_", "OTEL_"))}
    env.update({"REPLGATE_STATE_DIR": str(state_dir), "REPLGATE_MIN_IDLE": "0",
                "REPLGATE_OWNER": f"test-{secrets.token_hex(4)}",
                "REPLGATE_TEMPLATE_DIR": str(TEMPLATE_DIR)})
    if refused.command == "node" and "DATABASE_URL" in refused.env:
        env.update({"REPLGATE_TLS_CA": str(certs.ca), "REPLGATE_TLS_CERT": str(certs.node_cert),
                    "REPLGATE_TLS_KEY": str(certs.node_key)})
    env.update({f"REPLGATE_{name}": value for name, value in refused.env.items()})
    port = free_port()
    arguments = {"serve": ["serve", "--port", "0"],
                 "node": ["node", "--advertise", f"127.0.0.1:{port}", "--listen",
                          f"127.0.0.1:{port}", "--id", "matrix-refused"],
                 "audit": ["audit", "verify"]}[refused.command]
    command = [sys.executable, "-m", "gateway.cli", *arguments]
    try:
        return subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=REFUSAL_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:  # it started: what it said, for the failure
        said = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else str(
            exc.stderr)
        return subprocess.CompletedProcess(command, -1, "", f"still running after "
                                           f"{REFUSAL_TIMEOUT_S} s:\n{said}")
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def refusals(certs: ClusterCerts) -> Iterator[dict[str, Future[subprocess.CompletedProcess[str]]]]:
    """Every refused configuration's run, side by side, begun with the module (the valid
    gateways start meanwhile)."""
    with ThreadPoolExecutor(6) as pool:
        yield {name: pool.submit(_refuse, refused, certs) for name, refused in REFUSED.items()}


@pytest.mark.parametrize("name", list(REFUSED))
def test_what_cannot_work_stops_with_one_line_naming_the_setting(
        name: str, refusals: dict[str, Future[subprocess.CompletedProcess[str]]]) -> None:
    done, refused = refusals[name].result(), REFUSED[name]
    lines = done.stderr.strip().splitlines()
    said = [line for line in lines if line.startswith("replgate: ")]
    assert done.returncode == refused.status, done.stderr
    assert "Traceback" not in done.stderr and not any(" ERROR " in line for line in lines), \
        done.stderr
    assert len(said) == 1 and said == lines[-1:], done.stderr
    assert refused.says in said[0], said
    assert "secret" not in said[0], said  # a URL's password is never repeated
