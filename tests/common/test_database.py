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
from sqlalchemy.exc import IntegrityError, OperationalError

from common import database as database_module
from common.database import Database, DatabaseError, Write, database_url
from common.settings import Settings
from common.store import SessionRecord
from gateway.audit import AuditLog
from gateway.audit_records import AuditRecord, chain_hash
from gateway.store import Store
from kernel_pool import DoneEvent, Execution, ExecutionStatus, SandboxInfo
from tests.conftest import REPO, create_database, drop_database, postgres_admin

LEGACY = Path(__file__).parent / "data" / "state-0.1"
"""A state directory made by replgate before Alembic (gateway/store.py and gateway/audit.py of
commit 2e8a168): two sessions (one deleted), two finished executions and one left running,
a key of tenant acme, two audit records and audit.head."""


def _record(n: int, code: str | None = None) -> AuditRecord:
    execution = Execution.from_events([DoneEvent(status=ExecutionStatus.OK, execution_count=n,
                                                 duration_ms=1.0)])
    return AuditRecord.for_execution(execution, code=f"x = {n}" if code is None else code,
                                     tenant="acme", session_id="s1", execution_id=f"e{n}")


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
    assert revision == "0014"
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


async def test_an_audit_record_is_committed_with_its_writes_or_none_of_them(
        database_target: str | Path) -> None:
    """An execution's end and its session's activity go with the execution's audit record (on
    PostgreSQL, one statement): all of them are in, or, when one fails, none."""
    async with Store.open(database_target) as store:
        audit = await AuditLog.open(store)
        await store.create_session(SessionRecord(id="s1", tenant="acme", profile="default"))
        await store.start_execution("e1", "s1", "acme", "x = 1")
        done = DoneEvent(status=ExecutionStatus.OK, execution_count=1, duration_ms=2.0)
        sandbox = SandboxInfo(sandbox_id="sb1", backend="docker", profile="default",
                              container_id="c0ffee", workspace="/ws/sb1", socket_dir="/run/sb1")
        entry = await audit.append(_record(1), writes=[
            store.execution_end("e1", "ok", 1, [done], Execution.from_events([done])),
            store.activity("s1", execution_count=7, last_active_at="2030-01-01T00:00:00",
                           sandbox=sandbox)])
        assert entry.seq == 1
        session = await store.get_session("s1")
        assert session is not None and (session.execution_count, session.last_active_at,
                                        session.sandbox) == (7, "2030-01-01T00:00:00", sandbox)
        execution = await store.get_execution("e1")
        assert execution is not None and execution.status == "ok" and execution.events == [done]
        assert execution.finished_at is not None

        # The second write breaks a constraint: the first is not kept, nor the record.
        with pytest.raises(IntegrityError):
            await audit.append(_record(2), writes=[
                store.activity("s1", execution_count=8, last_active_at="2031-01-01T00:00:00",
                               sandbox=None),
                Write("INSERT INTO audit_head (id, seq, hash) VALUES (:id, 0, :id)", {"id": 2})])
        session = await store.get_session("s1")
        assert session is not None and session.execution_count == 7
        result = await audit.verify()
        assert result.ok and result.records == 1, result.problems


async def test_audit_chain_hashes_any_code_as_verify_recomputes_it(
        database_target: str | Path) -> None:
    """On PostgreSQL the database computes each record's hash: it must be the one verify
    recomputes in Python whatever the code holds."""
    codes = ["print('é ü 日本 🐍')", "s = '\\ud800'\nt = '\udc00'", "a = \"quote\" \\ back",
             "nul = '\x00'", "x = ':name ::text %(p)s $1'", ""]
    async with Store.open(database_target) as store:
        audit = await AuditLog.open(store)
        entries = [await audit.append(_record(n, code)) for n, code in enumerate(codes, 1)]
        result = await audit.verify()
    assert result.ok and result.records == len(codes), result.problems
    assert [e.seq for e in entries] == list(range(1, len(codes) + 1))
    assert all(e.hash == chain_hash(e.prev_hash, e.record) for e in entries)
    assert [e.prev_hash for e in entries[1:]] == [e.hash for e in entries[:-1]]


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
    # A database of its own: opening one migrates it to this checkout's head, which would
    # break the shared one for checkouts with another head.
    url = create_database()
    database = await Database.open(url)
    try:
        assert "replgate:***@" in repr(database) and database.dialect == "postgresql"
    finally:
        await database.close()
        drop_database(url)


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
