"""The database of gateways and nodes: one SQLAlchemy engine over SQLite (the embedded default)
or PostgreSQL.

``REPLGATE_DATABASE_URL`` chooses it: unset, ``replgate.db`` in the state directory, as ever;
``postgresql://user:password@host/db``, a server that several gateways (and, later, nodes) share.
Every statement of :mod:`common.store`, :mod:`gateway.store` and :mod:`gateway.audit` is the
same SQL for both; what differs is said here once:

- **Autocommit by default.** A repository method is one statement, so :meth:`Database.connect`
  gives a connection on which each statement commits on its own: one round trip (one hop to
  aiosqlite's thread), never a transaction held across an ``await`` for others to queue behind.
  SQLite's driver is put in autocommit mode and SQLAlchemy's own BEGIN, COMMIT and ROLLBACK
  become no-ops when no transaction is open, so they cost no hop either.
- **Transactions where a read decides a write** (:meth:`Database.transaction`): SQLite's
  ``BEGIN IMMEDIATE`` takes the file's write lock at once, so two writers never both read
  and then fail to upgrade; PostgreSQL's plain BEGIN, the caller locking the rows it reads
  (``SELECT ... FOR UPDATE``).
- **The schema** is Alembic's (``common/migrations``), brought to its head when the database
  opens, under a lock (SQLite's write lock, PostgreSQL's advisory lock) so gateways starting at
  once migrate it one at a time. A SQLite file made before Alembic (``PRAGMA user_version`` 1,
  no ``alembic_version``) is recognised and migrated from there: nothing in it is lost.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NamedTuple

import anyio.to_thread
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, event, inspect, make_url, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, DBAPIError, DisconnectionError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

__all__ = ["LEGACY_REVISION", "Database", "DatabaseError", "StoreError", "Write", "database_url"]

LEGACY_REVISION = "0001"
"""The revision whose schema is that of the SQLite files replgate made before Alembic."""
_LEGACY_USER_VERSION = 1
_MIGRATION_LOCK = 0x7265706C67617465  # "replgate": PostgreSQL's advisory lock of migrations
_TRANSACTION = "replgate_transaction"
"""The execution option of :meth:`Database.transaction`'s connections (SQLite: BEGIN IMMEDIATE)."""


class Write(NamedTuple):
    """A statement that is committed with another or not at all (an execution's end goes with
    its audit record: :meth:`gateway.audit.AuditLog.append`): SQL with ``:named`` parameters,
    and their values."""

    sql: str
    params: dict[str, Any]


class StoreError(Exception):
    """Base of the store's errors (:mod:`common.store` re-exports it)."""


class DatabaseError(StoreError):
    """The database cannot be used: a bad URL, or a schema newer than this replgate's."""


def database_url(target: str | Path | URL) -> URL:
    """The SQLAlchemy URL, its async driver named, of a SQLite file's path or of a database URL
    (``REPLGATE_DATABASE_URL``: ``postgresql://...`` or ``sqlite:////path/to/file.db``).

    Raises:
        DatabaseError: a URL of another kind, or no URL at all.
    """
    if isinstance(target, Path) or (isinstance(target, str) and "://" not in target):
        return URL.create("sqlite+aiosqlite", database=str(target))
    try:
        url = make_url(target)
    except (ArgumentError, ValueError) as exc:  # (a port that is not a number: ValueError)
        raise DatabaseError(f"REPLGATE_DATABASE_URL is not a database URL ({exc}): write "
                            "postgresql://user:password@host:5432/database or "
                            "sqlite:////path/to/file.db") from None
    backend = url.get_backend_name()
    if backend in ("postgresql", "postgres"):
        return url.set(drivername="postgresql+psycopg")
    if backend == "sqlite" and url.database not in (None, "", ":memory:"):
        return url.set(drivername="sqlite+aiosqlite")
    raise DatabaseError("REPLGATE_DATABASE_URL must be postgresql://user:password@host/database "
                        "or sqlite:////path/to/file.db")


class Database:
    """An engine and the way this project uses it. Make one with :meth:`open`."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.url = engine.url
        self.dialect: str = engine.dialect.name
        """``sqlite`` or ``postgresql``: the few statements that differ ask it."""
        self._closed = False

    def __repr__(self) -> str:
        return f"<Database {self.url.render_as_string(hide_password=True)!r}>"

    @property
    def shared(self) -> bool:
        """Whether other gateways may use it too (PostgreSQL): what this gateway remembers of
        it may be stale, and is read again. An SQLite file is one gateway's alone."""
        return self.dialect != "sqlite"

    @property
    def sqlite_path(self) -> Path | None:
        """The SQLite file, or None on PostgreSQL."""
        return Path(self.url.database or "") if self.dialect == "sqlite" else None

    @classmethod
    async def open(cls, target: str | Path | URL) -> Database:
        """Connect to what :func:`database_url` makes of ``target`` (a SQLite file is made,
        with its folder, if needed) and migrate the schema to this replgate's head.

        Raises:
            DatabaseError: the database cannot be reached or used (the message names the
                setting to change), or its schema is newer than this replgate knows.
        """
        url = database_url(target)
        # What to change when it cannot be opened: a URL is the setting's, a path the state
        # directory's.
        setting = ("REPLGATE_DATABASE_URL" if isinstance(target, str | URL) and "://" in str(target)
                   else "REPLGATE_STATE_DIR")
        if url.get_backend_name() == "sqlite":
            path = Path(url.database or "")
            try:
                await anyio.to_thread.run_sync(
                    lambda: path.parent.mkdir(parents=True, exist_ok=True))
            except OSError as exc:
                raise DatabaseError(f"{setting}: cannot make the folder of the database "
                                    f"{path} ({exc.strerror or exc})") from exc
            # No reset on return to the pool: every statement commits on its own, and a
            # transaction always ends in its commit or rollback.
            engine = create_async_engine(url, pool_reset_on_return=None)
            _sqlite_autocommit(engine)
        else:
            engine = create_async_engine(url, isolation_level="AUTOCOMMIT")
            _ping_when_idle(engine)
        database = cls(engine)
        try:
            await database._migrate()
        except DBAPIError as exc:  # unreachable, refused, no such database, no right to it
            await engine.dispose()
            reason = " ".join(str(exc.orig or exc).split())
            raise DatabaseError(
                f"{setting}: cannot use the database "
                f"{url.render_as_string(hide_password=True)} ({reason}); check that it "
                "runs, is reachable from here and that the user may create tables in it"
            ) from exc
        except BaseException:
            await engine.dispose()
            raise
        return database

    async def close(self) -> None:
        """Close every connection (idempotent)."""
        if not self._closed:
            self._closed = True
            await self.engine.dispose()

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[AsyncConnection]:
        """A connection on which each statement commits on its own."""
        async with self.engine.connect() as connection:
            yield connection

    @contextlib.asynccontextmanager
    async def transaction(self, durable: bool = False) -> AsyncIterator[AsyncConnection]:
        """A connection in a transaction that commits when the block ends (rolls back on an
        error): SQLite's ``BEGIN IMMEDIATE`` (the file's one writer from the start), or
        PostgreSQL's ``BEGIN`` at READ COMMITTED.

        ``durable``: on SQLite, this commit is synced to disk (``synchronous=FULL``, with
        everything committed before it), where other commits are not. PostgreSQL syncs every
        commit.
        """
        options: dict[str, Any] = {_TRANSACTION: True}
        if self.dialect == "postgresql":
            options["isolation_level"] = "READ COMMITTED"
        async with self.engine.connect() as connection:
            connection = await connection.execution_options(**options)
            # The safety level may not change inside a transaction: it is set on the driver's
            # connection itself, before SQLAlchemy begins one, and set back after the commit.
            driver = (await connection.get_raw_connection()).driver_connection \
                if durable and self.dialect == "sqlite" else None
            if driver is not None:
                await driver.execute("PRAGMA synchronous=FULL")
            try:
                async with connection.begin():
                    yield connection
            finally:
                if driver is not None and not connection.invalidated:
                    await driver.execute("PRAGMA synchronous=NORMAL")

    async def _migrate(self) -> None:
        async with self.transaction() as connection:
            if self.dialect == "postgresql":
                await connection.execute(text("SELECT pg_advisory_xact_lock(:key)"),
                                         {"key": _MIGRATION_LOCK})
            await connection.run_sync(_upgrade)


def alembic_config(connection: Connection | None = None) -> Config:
    """Alembic's configuration of ``common/migrations``, on ``connection`` when given."""
    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    config.attributes["connection"] = connection
    return config


def _upgrade(connection: Connection) -> None:
    config = alembic_config(connection)
    script = ScriptDirectory.from_config(config)
    current = MigrationContext.configure(connection).get_current_revision()
    if current is None:
        tables = set(inspect(connection).get_table_names())
        if connection.dialect.name == "sqlite":
            version = connection.exec_driver_sql("PRAGMA user_version").scalar_one()
            if version > _LEGACY_USER_VERSION:
                raise DatabaseError(
                    f"database {connection.engine.url.database} has schema version {version}, "
                    "newer than this replgate's; upgrade replgate or use another "
                    "REPLGATE_STATE_DIR")
        if "sessions" in tables:  # made before Alembic: its schema is the first revision's
            command.stamp(config, LEGACY_REVISION)
    elif current not in {rev.revision for rev in script.walk_revisions()}:
        raise DatabaseError(
            f"the database's schema is at revision {current!r}, newer than this replgate's "
            f"(head {script.get_current_head()!r}); upgrade replgate")
    command.upgrade(config, "head")


IDLE_PING_S = 5.0
"""A pooled PostgreSQL connection that sat unused this long is pinged before it is used."""
_IDLE_SINCE = "replgate_idle_since"


def _ping_when_idle(engine: AsyncEngine) -> None:
    """Ping a connection taken from the pool after :data:`IDLE_PING_S` unused, and replace it if
    the server has dropped it (a restart, a proxy's idle timeout). SQLAlchemy's
    ``pool_pre_ping`` pinged at every checkout, two round trips of every execution's records.
    A connection in steady use that the server drops fails on its next statement instead:
    SQLAlchemy then replaces it and every connection the pool held before it, and the caller
    sees the database as away for that statement (records are tried again, a request is
    answered 503)."""
    sync_engine = engine.sync_engine
    dialect = sync_engine.dialect

    @event.listens_for(sync_engine, "checkin")
    def _idle(_dbapi_connection: Any, record: Any) -> None:
        record.info[_IDLE_SINCE] = time.monotonic()

    @event.listens_for(sync_engine, "checkout")
    def _taken(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get(_IDLE_SINCE)
        if idle_since is None or time.monotonic() - idle_since < IDLE_PING_S:
            return
        try:
            dialect.do_ping(dbapi_connection)
        except dialect.loaded_dbapi.Error as exc:
            if dialect.is_disconnect(exc, dbapi_connection, None):
                # The pool's documented signal: discard this one, take another.
                raise DisconnectionError(f"the database dropped an idle connection: {exc}"
                                         ) from exc
            raise


def _sqlite_autocommit(engine: AsyncEngine) -> None:
    """SQLite's driver in autocommit mode, its pragmas on each new connection, BEGIN IMMEDIATE
    for :meth:`Database.transaction`, and no hop for a COMMIT or ROLLBACK with nothing open."""
    sync_engine = engine.sync_engine

    @event.listens_for(sync_engine, "connect")
    def _connected(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        # Rows by column name for the store's one-hop reads (common.store); SQLAlchemy's own
        # cursor reads them by position, as it does tuples.
        dbapi_connection.driver_connection.row_factory = sqlite3.Row
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        # NORMAL: commits are not synced one by one (the WAL stays consistent; a process crash
        # loses nothing). The audit log commits each record with synchronous=FULL, which syncs
        # the history written before it too; a power cut can lose only what followed.
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=5000")
        cursor.close()

    @event.listens_for(sync_engine, "begin")
    def _begin(connection: Connection) -> None:
        if connection.get_execution_options().get(_TRANSACTION):
            connection.exec_driver_sql("BEGIN IMMEDIATE")

    dialect = sync_engine.dialect

    def _end(dbapi_connection: Any, end: str) -> None:
        # In autocommit mode the driver has no transaction open unless BEGIN made one; asking
        # it to end none would still cost a hop to aiosqlite's thread on every statement.
        if _in_transaction(dbapi_connection):
            getattr(dbapi_connection, end)()

    dialect.do_commit = lambda dbapi_connection: _end(dbapi_connection, "commit")  # type: ignore[method-assign]
    dialect.do_rollback = lambda dbapi_connection: _end(dbapi_connection, "rollback")  # type: ignore[method-assign]


def _in_transaction(dbapi_connection: Any) -> bool:
    """Whether SQLite has a transaction open on this (aiosqlite-adapted) connection; read from
    the sqlite3 connection itself, which answers from any thread."""
    raw = getattr(getattr(dbapi_connection, "_connection", None), "_conn", None)
    return True if raw is None else bool(raw.in_transaction)
