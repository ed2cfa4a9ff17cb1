"""Fixtures shared by every test package: a real Docker engine and a real running gateway.

Nothing here mocks Docker, the kernel or the database. Tests that need the engine fail (they
never skip) when it is missing: a green run that skipped the sandbox would prove nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import docker
import httpx
import psycopg
import pytest

from node.local import stop_group

REPO = Path(__file__).resolve().parent.parent
TEST_RUNTIME = os.environ.get("REPLGATE_TEST_RUNTIME", "runc")
"""The isolation every sandbox of the run uses (``runc`` or ``gvisor``): CI runs the suites
under runc, and a subset again with ``REPLGATE_TEST_RUNTIME=gvisor`` (which and why:
setup/test_legs.sh)."""
TEST_DATABASE = os.environ.get("REPLGATE_TEST_DATABASE", "sqlite")
"""The database of every test gateway: ``sqlite`` (the file in its state directory, the
default) or ``postgresql`` (a database of its own on :data:`TEST_POSTGRES`, created with the
gateway and dropped after it). CI runs the gateway's suites on SQLite, and a subset again with
``REPLGATE_TEST_DATABASE=postgresql`` (which and why: setup/test_legs.sh)."""
TEST_POSTGRES = os.environ.get("REPLGATE_TEST_POSTGRES",
                               "postgresql://replgate:replgate@127.0.0.1:5432/replgate")
"""A PostgreSQL server and a role that may create databases (run.sh's ensure_postgres starts
Debian's and sets this)."""
TEMPLATE_DIR = Path(tempfile.gettempdir()) / f"rg-templates-{os.getpid()}"
"""The kernel templates every pool and gateway of the run shares (as gateways of one host
may): the first pool of a profile makes its template, the others restore from it. Tests of
the templates themselves use folders of their own."""


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        pytest.fail(f"no Docker engine answers ({exc}); run ./run.sh test, which starts one")
    yield client
    client.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CREATED_DATABASES: list[str] = []
"""PostgreSQL databases the run made; any still there at its end is dropped."""


def postgres_admin(url: str = TEST_POSTGRES) -> psycopg.Connection[tuple[Any, ...]]:
    """A connection to the tests' PostgreSQL (its own database unless ``url`` names another),
    in autocommit mode."""
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        pytest.fail(f"no PostgreSQL answers at {url} ({exc}); run ./run.sh test, which "
                    "starts one (or set REPLGATE_TEST_POSTGRES)")


def create_database() -> str:
    """A new, empty PostgreSQL database on :data:`TEST_POSTGRES`; its URL."""
    name = f"rg_{secrets.token_hex(6)}"
    with postgres_admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    CREATED_DATABASES.append(name)
    return urlunsplit(urlsplit(TEST_POSTGRES)._replace(path=f"/{name}"))


def drop_database(url: str) -> None:
    """Drop a database :func:`create_database` made (its connections cut)."""
    name = urlsplit(url).path.lstrip("/")
    with postgres_admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    if name in CREATED_DATABASES:
        CREATED_DATABASES.remove(name)


@pytest.fixture
def database_target(tmp_path: Path) -> Iterator[str | Path]:
    """What ``Store.open`` takes, of the run's database kind: a SQLite file's path (in the
    test's folder), or a new PostgreSQL database's URL (dropped after the test)."""
    if TEST_DATABASE != "postgresql":
        yield tmp_path / "state" / "replgate.db"
        return
    url = create_database()
    yield url
    drop_database(url)


@dataclass
class GatewayProcess:
    """A ``replgate serve`` subprocess with two tenants' keys and its own state and owner."""

    url: str
    state_dir: Path
    owner: str
    keys: dict[str, str]
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    log_path: Path = field(default_factory=Path)
    own_database: bool = False
    """Its PostgreSQL database was made for it alone (and goes with it)."""
    warm: bool = True
    """It runs sessions itself: ready once a warm kernel is (else once it answers)."""

    def headers(self, tenant: str = "alpha") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tenant]}"}

    @property
    def database_url(self) -> str | None:
        """Its PostgreSQL database, or None: SQLite in its state directory."""
        return self.env.get("REPLGATE_DATABASE_URL")

    def audit_records(self) -> list[dict[str, Any]]:
        """The audit log's records in ``seq`` order, read from its database as it is now
        (read-only on SQLite: a second read-write connection is what test_api's audit test
        covers)."""
        query = "SELECT record FROM audit_log ORDER BY seq"
        if self.database_url is not None:
            with postgres_admin(self.database_url) as db:
                return [json.loads(row[0]) for row in db.execute(query)]
        uri = f"file:{self.state_dir / 'replgate.db'}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
            return [json.loads(row[0]) for row in db.execute(query)]

    def start(self, timeout_s: float = 120.0) -> None:
        STARTED.append(self)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gateway.cli", "serve", "--port",
                 self.url.rsplit(":", 1)[1]],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited: {self.log_path.read_text()[-3000:]}")
            try:
                answer = httpx.get(f"{self.url}/healthz", timeout=1)
                if answer.status_code == 200 and (
                        not self.warm or answer.json()["pool"]["idle"] >= 1):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        log = self.log_path.read_text()[-3000:]
        raise RuntimeError(f"gateway not ready in {timeout_s}s: {log}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None:
            stop_group(self.process, sig)
        self.process = None


CLIENT_TIMEOUT_S = 152.0
"""How long the tests' shared HTTP clients wait for an answer: past the gateway's own kernel
start timeout (60 s) and its second try in a fresh sandbox. Twice in the gVisor leg on a loaded
machine a session's start took over 40 s (ci13: nbclient's kernel start; ci16: `POST
/v1/sessions`); those tests check the API, not how fast a kernel starts (bench/ does)."""

STARTED: list[GatewayProcess] = []
"""Every gateway the run started: a failing test's report shows what their logs said meanwhile."""

LOG_LINES_ON_FAILURE = 40


def _started_logs() -> set[Path]:
    # pytest loads this file as ``conftest`` and test modules import it as ``tests.conftest``:
    # two module objects, each with its own list.
    modules = [sys.modules.get(name) for name in ("conftest", "tests.conftest")]
    return {g.log_path for module in modules if module is not None
            for g in getattr(module, "STARTED", []) if g.log_path.is_file()}


def _log_sizes() -> dict[Path, int]:
    return {path: path.stat().st_size for path in _started_logs()}


def pytest_sessionfinish(session: pytest.Session) -> None:
    shutil.rmtree(TEMPLATE_DIR, ignore_errors=True)
    for name in list(CREATED_DATABASES):
        drop_database(urlunsplit(urlsplit(TEST_POSTGRES)._replace(path=f"/{name}")))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    item.stash[_LOG_SIZES] = _log_sizes()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
        item: pytest.Item) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """On a failure, add what the gateways logged during the test (requests left out): a
    failure in CI then says what the service saw, not only what the client got."""
    report = yield
    if not report.failed:
        return report
    before = item.stash.get(_LOG_SIZES, {})
    for path in sorted(_started_logs()):
        with open(path, "rb") as log:
            log.seek(before.get(path, 0))
            lines = [line for line in log.read().decode(errors="replace").splitlines()
                     if "uvicorn.access" not in line]
        if lines:
            report.sections.append((f"gateway log {path.name} ({report.when})",
                                    "\n".join(lines[-LOG_LINES_ON_FAILURE:])))
    return report


_LOG_SIZES = pytest.StashKey[dict[Path, int]]()


def make_gateway(**settings: str) -> GatewayProcess:
    """A gateway (not started) with a short state dir (Unix socket paths are short)."""
    state_dir = Path(tempfile.mkdtemp(prefix="rg-", dir="/tmp"))
    owner = f"test-{secrets.token_hex(4)}"
    keys = {"alpha": f"rg_alpha_{secrets.token_hex(8)}", "beta": f"rg_beta_{secrets.token_hex(8)}"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPLGATE_")}
    env["REPLGATE_RUNTIME"] = TEST_RUNTIME
    env.update({
        "REPLGATE_STATE_DIR": str(state_dir), "REPLGATE_OWNER": owner,
        "REPLGATE_API_KEYS": ",".join(f"{t}:{k}" for t, k in keys.items()),
        "REPLGATE_MIN_IDLE": "1", "REPLGATE_MAX_KERNELS": "6",
        "REPLGATE_INTERRUPT_GRACE_S": "2.0", "REPLGATE_LOG_LEVEL": "info",
        # Workspaces reserve their blocks on disk: keep the test gateways' footprint small.
        "REPLGATE_WORKSPACE_SIZE": "256m",
        # Stopped test gateways leave nothing behind (running_gateway checks it); the tests of
        # sessions that survive a stop turn this back on.
        "REPLGATE_KEEP_SESSIONS_ON_STOP": "false",
        "REPLGATE_TEMPLATE_DIR": str(TEMPLATE_DIR),
        # Its own sessions even with a database URL (the PostgreSQL leg): the cluster tests
        # turn this off, for gateways whose sessions run on nodes.
        "REPLGATE_LOCAL_NODE": "true",
    })
    own_database = TEST_DATABASE == "postgresql" and "database_url" not in settings
    if own_database:
        env["REPLGATE_DATABASE_URL"] = create_database()
    env.update({f"REPLGATE_{k.upper()}": v for k, v in settings.items()})
    return GatewayProcess(url=f"http://127.0.0.1:{free_port()}", state_dir=state_dir, owner=owner,
                          keys=keys, env=env, log_path=state_dir.with_suffix(".log"),
                          own_database=own_database)


@contextmanager
def repeating(step: Callable[[], object], every_s: float) -> Iterator[None]:
    """Call ``step`` every ``every_s`` seconds in a thread of its own while the block runs
    (a sampler, a watcher), and once the block is over wait for the call under way."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            step()
            stop.wait(every_s)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextmanager
def small_disk(size_mib: int) -> Iterator[Path]:
    """A small ext4 file system mounted on a new folder: a host's disk a test can fill."""
    root = Path(tempfile.mkdtemp(prefix="rg-disk-", dir="/tmp"))
    image = root.with_suffix(".img")
    with open(image, "wb") as f:
        f.truncate(size_mib * 2**20)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(root)], check=True)
    try:
        yield root
    finally:
        subprocess.run(["umount", "--lazy", str(root)], check=False)
        image.unlink(missing_ok=True)
        shutil.rmtree(root, ignore_errors=True)


def fill_disk(path: Path, leave: int) -> None:
    """Take the file system's free space down to about ``leave`` bytes with one file."""
    # ext4 counts the blocks of a file deleted just before (a snapshot a resume removed) as
    # free only once its journal commits (within 5 s): measured before that, the space they
    # free afterwards was left over (CI: a pause that was to find the disk full fitted).
    os.sync()
    free = shutil.disk_usage(path.parent).free
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        size = os.fstat(fd).st_size + max(0, free - leave)
        if size:
            os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)


def containers_of(client: docker.DockerClient, owner: str, **labels: str) -> list[str]:
    """The ids of ``owner``'s containers, stopped ones too, with ``labels`` too
    (``profile="default"`` is ``io.replgate.profile=default``). One listing, no inspection:
    docker's ``containers.list`` inspects each listed container, which fails with NotFound when
    one is removed in between (a warm kernel recycled, a deleted session's container going)."""
    wanted = [f"io.replgate.owner={owner}",
              *(f"io.replgate.{name}={value}" for name, value in labels.items())]
    listed = client.api.containers(all=True, quiet=True, filters={"label": wanted})
    return [entry["Id"] for entry in listed]


def inspected(client: docker.DockerClient, container_ids: list[str]) -> list[dict[str, Any]]:
    """The engine's inspection of each container, leaving out one removed since it was
    listed."""
    found = []
    for container_id in container_ids:
        try:
            found.append(client.api.inspect_container(container_id))
        except docker.errors.NotFound:
            continue
    return found


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path``, in the order they were mounted."""
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts]
    return [p for p in points if p == str(path) or p.startswith(f"{path}/")]


def unmount_all(path: Path) -> list[str]:
    """Unmount whatever is mounted under ``path`` (a test's leftovers); what was mounted."""
    mounted = mounts_under(path)
    for point in reversed(mounted):
        subprocess.run(["umount", "--lazy", point], check=False)
    return mounted


@contextmanager
def running_gateway(docker_client: docker.DockerClient, process: GatewayProcess | None = None,
                    **settings: str) -> Iterator[GatewayProcess]:
    """A started gateway (``process``, else a new one with ``settings``); on exit it is stopped
    and must have left no container and no mount (a workspace, a socket folder) behind."""
    process = process or make_gateway(**settings)
    process.start()
    try:
        yield process
    finally:
        process.stop()
        left = containers_of(docker_client, process.owner)
        for cid in left:
            docker_client.api.remove_container(cid, force=True)
        mounted = unmount_all(process.state_dir)
        shutil.rmtree(process.state_dir, ignore_errors=True)
        if process.own_database and process.database_url is not None:
            drop_database(process.database_url)
    assert not left, f"gateway left containers behind: {left}"
    assert not mounted, f"gateway left mounts behind: {mounted}"


@pytest.fixture(scope="session")
def gateway(docker_client: docker.DockerClient) -> Iterator[GatewayProcess]:
    """One running ``replgate serve`` for the session; no container of it survives the run."""
    with running_gateway(docker_client) as process:
        yield process
