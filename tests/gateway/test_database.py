"""The database under the store and the audit log: migrations (a state directory of replgate 0.1
included), the URL setting, and several writers of one database at once."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from gateway import database as database_module
from gateway.audit import AuditLog, AuditRecord
from gateway.database import Database, DatabaseError, database_url
from gateway.settings import Settings
from gateway.store import SessionRecord, Store
from kernel_pool import DoneEvent, Execution, ExecutionStatus
from tests.conftest import REPO, create_database, drop_database, postgres_admin

LEGACY = Path(__file__).parent / "data" / "state-0.1"
"""A state directory made by replgate before Alembic (gateway/store.py and gateway/audit.py of
commit 2e8a168): two sessions (one deleted), two finished executions and one left running,
a key of tenant acme, two audit records and audit.head."""


def _record(n: int) -> AuditRecord:
    execution = Execution.from_events([DoneEvent(status=ExecutionStatus.OK, execution_count=n,
                                                 duration_ms=1.0)])
    return AuditRecord.for_execution(execution, code=f"x = {n}", tenant="acme",
                                     session_id="s1", execution_id=f"e{n}")


async def test_legacy_state_dir_migrates_with_nothing_lost(tmp_path: Path) -> None:
    state = tmp_path / "state"
    shutil.copytree(LEGACY, state)
    async with Store.open(state / "replgate.db") as store:
        sessions = await store.list_sessions(include_deleted=True)
        assert [(s.id, s.deleted, s.node, s.epoch) for s in sessions] == [
            ("s1", False, None, 0), ("s2", True, None, 0)]
        assert sessions[0].metadata == {"purpose": "legacy"} and sessions[0].env == {"A": "1"}
        assert sessions[0].sandbox is not None and sessions[0].sandbox.container_id == "c0ffee"
        history = await store.list_executions("s1")
        assert [(e.id, e.seq, e.status) for e in history] == [
            ("e1", 1, "ok"), ("e2", 2, "ok"), ("e3", 3, "running")]
        assert history[1].result is not None and history[1].result.stdout == "out 2\n"
        assert await store.tenant_for_key("rg_acme_key_0123456789abcdef") == "acme"
        assert await store.mark_unfinished_as("interrupted", node="gw-1") == 1
        audit = await AuditLog.open(store)
        assert (await audit.verify()).ok
        entry = await audit.append(_record(3))
        assert entry.seq == 3
        result = await audit.verify()
        assert result.ok and result.records == 3, result.problems
    with sqlite3.connect(state / "replgate.db") as raw:
        (revision,) = raw.execute("SELECT version_num FROM alembic_version").fetchone()
    raw.close()
    assert revision == "0005"
    # and the command line agrees, on the migrated folder
    env = {"REPLGATE_STATE_DIR": str(state), "PATH": "/usr/bin:/bin"}
    verify = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "gateway.cli", "audit", "verify"], env=env,
        capture_output=True, text=True, timeout=60, cwd=REPO)
    assert verify.returncode == 0 and "ok: 3 records" in verify.stdout, verify.stdout


async def test_newer_schema_revision_is_refused(database_target: str | Path) -> None:
    async with Store.open(database_target) as store, \
            store.database.transaction() as connection:
        await connection.exec_driver_sql("UPDATE alembic_version SET version_num = '9999'")
    with pytest.raises(DatabaseError, match="'9999', newer than this replgate's"):
        await Store.open(database_target)


async def test_starts_of_two_stores_on_one_database_never_share_a_seq(
        database_target: str | Path) -> None:
    # Two gateways recording executions of one session at once: each gets its own place.
    async with Store.open(database_target) as one, Store.open(database_target) as two:
        await one.create_session(SessionRecord(id="s1", tenant="acme", profile="default"))
        records = await asyncio.gather(*(
            store.start_execution(f"e{n}", "s1", "acme", str(n))
            for n in range(40) for store in [(one, two)[n % 2]]))
        assert sorted(r.seq for r in records) == list(range(1, 41))
        assert [r.seq for r in await two.list_executions("s1")] == list(range(1, 41))


async def test_two_audit_logs_on_one_database_append_one_chain(
        database_target: str | Path) -> None:
    async with Store.open(database_target) as one, Store.open(database_target) as two:
        logs = [await AuditLog.open(one), await AuditLog.open(two)]
        entries = await asyncio.gather(*(logs[n % 2].append(_record(n)) for n in range(60)))
        assert sorted(e.seq for e in entries) == list(range(1, 61))
        result = await logs[0].verify()
        assert result.ok and result.records == 60, result.problems


def test_database_url_names_the_async_drivers(tmp_path: Path) -> None:
    assert database_url(tmp_path / "x.db").render_as_string() == (
        f"sqlite+aiosqlite:///{tmp_path}/x.db")
    assert database_url("postgresql://u:p@db:5432/rg").drivername == "postgresql+psycopg"
    assert database_url("postgres://u:p@db/rg").drivername == "postgresql+psycopg"
    assert database_url("sqlite:////var/lib/rg.db").database == "/var/lib/rg.db"
    for bad in ("mysql://u:p@db/rg", "sqlite://", "not a url://"):
        with pytest.raises(DatabaseError, match="REPLGATE_DATABASE_URL"):
            database_url(bad)


def test_settings_refuse_a_bad_database_url_and_default_to_the_state_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLGATE_STATE_DIR", str(tmp_path))
    assert Settings().database == tmp_path / "replgate.db"
    monkeypatch.setenv("REPLGATE_DATABASE_URL", "postgresql://u:p@db/rg")
    assert Settings().database == "postgresql://u:p@db/rg"
    monkeypatch.setenv("REPLGATE_DATABASE_URL", "mysql://u:p@db/rg")
    with pytest.raises(ValueError, match="REPLGATE_DATABASE_URL must be"):
        Settings()


async def test_database_repr_hides_the_password() -> None:
    from tests.conftest import TEST_POSTGRES

    database = await Database.open(TEST_POSTGRES)
    try:
        assert "replgate:***@" in repr(database) and database.dialect == "postgresql"
    finally:
        await database.close()


async def test_postgresql_connections_dropped_while_idle_are_replaced_unseen(
        monkeypatch: pytest.MonkeyPatch) -> None:
    url = create_database()
    name = url.rsplit("/", 1)[1]

    def drop_connections() -> None:  # what a server restart or a proxy's idle timeout does
        with postgres_admin() as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))

    async def one() -> object:
        async with database.connect() as connection:
            return (await connection.execute(text("SELECT 1"))).scalar_one()

    database = await Database.open(url)
    try:
        assert await one() == 1
        # In steady use (taken again at once) a connection is not pinged: the server's drop
        # shows on the next statement, after which the pool holds none of the dropped ones.
        drop_connections()
        with pytest.raises(OperationalError):
            await one()
        assert await one() == 1
        # Idle for IDLE_PING_S (none here), it is pinged when taken out and replaced.
        monkeypatch.setattr(database_module, "IDLE_PING_S", 0.0)
        drop_connections()
        assert await one() == 1
    finally:
        await database.close()
        drop_database(url)
