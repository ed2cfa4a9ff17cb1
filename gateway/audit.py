"""The tamper-evident audit log: every piece of code an agent ran, in a hash chain.

Each execution becomes one :class:`AuditRecord`, stored as canonical JSON in the ``audit_log``
table of the gateway's database, row ``seq`` (1, 2, 3, ...) with
``hash = sha256(prev_hash + record_json)`` and the first ``prev_hash`` 64 zeros. Triggers refuse
UPDATE and DELETE, so a slip fails loudly; someone who drops the triggers and edits, deletes or
reorders rows is caught by :meth:`AuditLog.verify`, which recomputes the chain.

Several gateways may append to one chain (on a shared PostgreSQL database). The chain's end
lives in the database, in the one row of ``audit_head``: on PostgreSQL an append is one
statement that moves it (locking the row to its commit), computes the hash from it and adds the
record; on SQLite, ``BEGIN IMMEDIATE`` takes the file's write lock and the append chains on from
the head and moves it in that transaction. So there is one writer at a time and no fork,
whichever gateway writes.

What the chain alone cannot show is a cut-off tail: dropping the last rows leaves a valid,
shorter chain. The head row shows it when only the log was cut. With the embedded SQLite
database the latest ``seq`` and ``hash`` also go to ``audit.head`` beside it after each append
(replaced atomically), and verify compares the log against both. Someone able to rewrite the
database (and that file) can still rewrite history: for that, copy the head (or
:meth:`AuditLog.export`) somewhere they cannot reach.

The records and their hashing are in :mod:`gateway.audit_records`; :func:`redact` and the
:class:`RedactSecrets` logging filter, which keep keys out of the gateway's logs, in
:mod:`gateway.redaction`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import re
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import anyio.to_thread
from pydantic import BaseModel, Field
from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection

from common.database import Database, Write
from gateway.audit_records import AuditRecord, canonical_json, chain_hash
from gateway.store import Store

__all__ = [
    "GENESIS_HASH",
    "AuditEntry",
    "AuditLog",
    "VerifyResult",
]

logger = logging.getLogger(__name__)

GENESIS_HASH = "0" * 64
HEAD_FILE = "audit.head"


class AuditEntry(BaseModel):
    """One stored row of the log."""

    seq: int
    prev_hash: str
    hash: str
    record: str
    """The canonical JSON text exactly as hashed."""


class VerifyResult(BaseModel):
    """What :meth:`AuditLog.verify` found. ``problems`` name the ``seq`` they concern."""

    ok: bool
    records: int
    problems: list[str] = Field(default_factory=list)
    last_hash: str | None = None


class _Head(BaseModel):
    seq: int
    hash: str


class AuditLog:
    """The append-only, hash-chained log. Make one with :meth:`open`."""

    def __init__(self, database: Database, head_path: Path | None) -> None:
        self._database = database
        self._head_path = head_path
        self._last: tuple[int, str] | None = None
        """The end this gateway last wrote or read: where its next append expects the chain
        to end (others may have appended since)."""
        # SQLite: one append of this process at a time. They would queue on the file's lock
        # anyway, and SQLite's busy handler polls where this wakes the next at once.
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, store: Store, head_path: Path | None = None) -> AuditLog:
        """The log in the store's database (its tables are the schema's, made by migration).

        ``head_path`` defaults to ``audit.head`` beside a SQLite database, and to none on
        PostgreSQL, where several gateways write and only the database holds the head.
        """
        database = store.database
        if head_path is None and database.sqlite_path is not None:
            head_path = database.sqlite_path.parent / HEAD_FILE
        audit = cls(database, head_path)
        try:
            head = await _read_head(head_path)
        except ValueError as exc:
            logger.error("%s is unreadable (%s); run verify", head_path, exc)
            head = None
        stored = await audit._stored_head()
        audit._last = (stored.seq, stored.hash)
        if head is not None and head != stored and head.seq >= stored.seq:
            # The database's head is behind, or differs from, the one we wrote last: the log
            # was cut or rewritten with it. Chaining on from the file keeps that visible to
            # verify() (a seq gap, a broken link) instead of letting the next append paper
            # over it.
            logger.error("audit log's head in the database is seq %d but %s records seq %d; "
                         "run verify", stored.seq, head_path, head.seq)
            async with database.transaction() as connection:
                await connection.execute(
                    text("UPDATE audit_head SET seq = :seq, hash = :hash WHERE id = 1"),
                    {"seq": head.seq, "hash": head.hash})
            audit._last = (head.seq, head.hash)
        return audit

    def __repr__(self) -> str:
        seq, hash_ = self._last or (0, GENESIS_HASH)
        return f"<AuditLog {seq} records, head {hash_[:12]}>"

    async def _stored_head(self) -> _Head:
        async with self._database.connect() as connection:
            row = (await connection.execute(_READ_HEAD)).one()
        return _Head(seq=row.seq, hash=row.hash)

    async def append(self, record: AuditRecord, *, writes: Sequence[Write] = ()) -> AuditEntry:
        """Add a record at the end of the chain and move the head; ``writes`` (what the record
        is about: an execution's end and its session's activity) are committed with it, or
        none of them is.

        On PostgreSQL all of it is one statement, chained on from the head in the database (its
        row locked from then to the commit, one round trip: gateways appending in turn wait on
        each other no longer than that). On SQLite, one transaction under the file's write lock.

        Shielded: a caller cancelled mid-append cannot leave the transaction half done. An
        error writing ``audit.head`` propagates; the row and the database's head are in, and
        the file, lagging one record, is repaired by the next append.
        """
        record_json = record.canonical()
        if self._database.dialect == "postgresql":
            return await asyncio.shield(self._append_in_one_statement(record_json, writes))
        return await asyncio.shield(self._append_in_transaction(record_json, writes))

    async def _append_in_one_statement(self, record_json: str,
                                       writes: Sequence[Write]) -> AuditEntry:
        params: dict[str, Any] = {"record": record_json}
        for index, write in enumerate(writes):
            params.update({f"w{index}_{name}": value for name, value in write.params.items()})
        statement = _append_with(tuple(write.sql for write in writes))
        async with self._database.connect() as connection:
            row = (await connection.execute(statement, params)).one()
        entry = AuditEntry(seq=row.seq, prev_hash=row.prev_hash, hash=row.hash,
                           record=record_json)
        if self._last is None or entry.seq > self._last[0]:
            self._last = (entry.seq, entry.hash)
        return entry

    async def _append_in_transaction(self, record_json: str,
                                     writes: Sequence[Write]) -> AuditEntry:
        async with self._lock:
            # Durable: the record must be on disk before audit.head names it, or after a
            # power cut the file would point past the end of the log and look like
            # tampering. (This commit also syncs the history written before it.)
            async with self._database.transaction(durable=True) as connection:
                for write in writes:
                    await connection.execute(text(write.sql), write.params)
                entry = await self._advance_head(connection, record_json)
                await connection.execute(_INSERT_ENTRY, entry.model_dump())
            self._last = (entry.seq, entry.hash)
            if self._head_path is not None:
                await anyio.to_thread.run_sync(_write_head, self._head_path, entry.seq,
                                               entry.hash)
            return entry

    async def _advance_head(self, connection: AsyncConnection, record_json: str) -> AuditEntry:
        """Move the database's head past ``record_json``'s entry: from where this process last
        left it (a compare-and-set), else, when another process appended since, from where
        the database has it."""
        seq, hash_ = self._last or (0, GENESIS_HASH)
        while True:
            entry = AuditEntry(seq=seq + 1, prev_hash=hash_,
                               hash=chain_hash(hash_, record_json), record=record_json)
            moved = await connection.execute(_ADVANCE_HEAD, {
                "seq": entry.seq, "hash": entry.hash, "prev_seq": seq, "prev_hash": hash_})
            if moved.rowcount == 1:
                return entry
            row = (await connection.execute(_READ_HEAD)).one()
            seq, hash_ = row.seq, row.hash

    async def entries(self, batch: int = 1000) -> AsyncIterator[AuditEntry]:
        """Every stored row in ``seq`` order, as stored (nothing checked), read ``batch`` rows
        at a time (no transaction or cursor held open between them)."""
        after: int | None = None
        while True:
            async with self._database.connect() as connection:
                rows = (await connection.execute(text(
                    "SELECT seq, record, prev_hash, hash FROM audit_log "
                    f"{'' if after is None else 'WHERE seq > :after '}ORDER BY seq LIMIT :n"),
                    {"after": after, "n": batch})).all()
            for row in rows:
                yield AuditEntry(seq=row.seq, record=str(row.record),
                                 prev_hash=str(row.prev_hash), hash=str(row.hash))
            if len(rows) < batch:
                return
            after = rows[-1].seq

    async def verify(self) -> VerifyResult:
        """Recompute the chain and compare its end with the database's head (and
        ``audit.head``, with SQLite).

        Finds an edited record (its hash no longer matches), a deleted one (a seq gap and a
        broken link), reordered ones (broken links), and a cut tail or a rewritten end that
        the heads do not show. Without ``audit.head``, a log cut together with its head row
        shows only in ``records``: nothing inside the database can tell it from a young one.
        """
        # Read the heads first: appends write the row with (or before) the head, so every row
        # a head names is already in the table when we scan it.
        problems: list[str] = []
        head_unreadable = False
        try:
            file_head = await _read_head(self._head_path)
        except ValueError:
            file_head, head_unreadable = None, True
            problems.append(f"{self._head_path} is unreadable, so the log's end is unchecked")
        heads = [(await self._stored_head(), "the database's audit head")]
        if file_head is not None:
            heads.append((file_head, str(self._head_path)))
        count = 0
        prev_seq, prev_hash = 0, GENESIS_HASH
        hashes_at_heads: dict[int, str] = {}
        async for entry in self.entries():
            count += 1
            if entry.seq != prev_seq + 1:
                missing = (
                    f"seq {prev_seq + 1}" if entry.seq == prev_seq + 2
                    else f"seq {prev_seq + 1} to {entry.seq - 1}"
                )
                problems.append(f"seq {entry.seq}: follows seq {prev_seq}; {missing} missing")
            if entry.prev_hash != prev_hash:
                problems.append(
                    f"seq {entry.seq}: prev_hash does not match the hash of seq {prev_seq} "
                    "(a record before it was deleted, inserted or moved)"
                )
            if chain_hash(entry.prev_hash, entry.record) != entry.hash:
                problems.append(f"seq {entry.seq}: hash does not match its record (edited)")
            else:
                try:
                    json.loads(entry.record)
                except ValueError:
                    problems.append(f"seq {entry.seq}: record is not JSON")
            if any(entry.seq == head.seq for head, _ in heads):
                hashes_at_heads[entry.seq] = entry.hash
            prev_seq, prev_hash = entry.seq, entry.hash
        for head, source in heads:
            if head.seq == 0:
                continue
            if prev_seq < head.seq:
                problems.append(
                    f"seq {head.seq}: missing; {source} records seq {head.seq} but the log "
                    f"ends at seq {prev_seq} (tail cut off)")
            elif head.seq not in hashes_at_heads:
                problems.append(f"seq {head.seq}: missing, though {source} records it")
            elif hashes_at_heads[head.seq] != head.hash:
                problems.append(f"seq {head.seq}: hash differs from the one {source} records "
                                "(the log was rewritten)")
        if file_head is None and self._head_path is not None and count and not head_unreadable:
            problems.append(
                f"seq {prev_seq}: {self._head_path} is missing, so a cut-off tail cannot be "
                "ruled out"
            )
        return VerifyResult(
            ok=not problems, records=count, problems=problems,
            last_hash=prev_hash if count else None,
        )

    async def lines(self) -> AsyncIterator[str]:
        """The export: one JSON object per line, ``{"hash", "prev_hash", "record", "seq"}``.

        ``record`` is the stored canonical JSON spliced in as is, so re-serialising it with
        :func:`canonical_json` reproduces the hashed text for an outside check.
        """
        async for entry in self.entries():
            try:
                json.loads(entry.record)
                record = entry.record
            except ValueError:
                record = json.dumps(entry.record)
            yield (
                f'{{"hash":"{entry.hash}","prev_hash":"{entry.prev_hash}",'
                f'"record":{record},"seq":{entry.seq}}}\n'
            )

    async def export(self, target: TextIO | str | Path, batch: int = 500) -> int:
        """Write :meth:`lines` to a text stream or a file path; returns the record count."""
        if isinstance(target, str | Path):
            path = Path(target)
            stream: TextIO = await anyio.to_thread.run_sync(
                lambda: path.open("w", encoding="utf-8")
            )
        else:
            stream = target
        count = 0
        pending: list[str] = []
        try:
            async for line in self.lines():
                pending.append(line)
                count += 1
                if len(pending) >= batch:
                    await anyio.to_thread.run_sync(stream.writelines, pending)
                    pending = []
            await anyio.to_thread.run_sync(stream.writelines, pending)
        finally:
            if stream is not target:
                await anyio.to_thread.run_sync(stream.close)
        return count


async def _read_head(path: Path | None) -> _Head | None:
    if path is None:
        return None

    def read() -> str | None:
        try:
            return path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    text = await anyio.to_thread.run_sync(read)
    return None if text is None else _Head.model_validate_json(text)


_ADVANCE_HEAD = text("UPDATE audit_head SET seq = :seq, hash = :hash "
                     "WHERE id = 1 AND seq = :prev_seq AND hash = :prev_hash")
_READ_HEAD = text("SELECT seq, hash FROM audit_head WHERE id = 1")
_INSERT_ENTRY = text("INSERT INTO audit_log (seq, record, prev_hash, hash) "
                     "VALUES (:seq, :record, :prev_hash, :hash)")
# PostgreSQL: the head moved and the entry added in one statement, the hash computed where the
# head is (``chain_hash``: the record is ASCII, so its UTF-8 is the same bytes in both). SET's
# right-hand sides read the row as it was: ``prev_hash`` keeps the head's hash for the entry.
_APPEND = ("head AS (UPDATE audit_head SET seq = seq + 1, prev_hash = hash, "
           "hash = encode(sha256(convert_to(hash || :record, 'UTF8')), 'hex') WHERE id = 1 "
           "RETURNING seq, prev_hash, hash) "
           "INSERT INTO audit_log (seq, record, prev_hash, hash) "
           "SELECT seq, :record, prev_hash, hash FROM head RETURNING seq, prev_hash, hash")
# How SQLAlchemy's text() finds a bound parameter: :name, not ::cast nor \:escaped.
_PARAMETER = re.compile(r"(?<![:\w\x5c]):(\w+)(?!:)")


@functools.lru_cache(maxsize=32)
def _append_with(writes: tuple[str, ...]) -> TextClause:
    """:data:`_APPEND` preceded by ``writes`` as data-modifying CTEs, one statement, each
    write's parameters renamed apart (``:name`` of the i-th becomes ``:wi_name``). Made once
    per set of statements: the same few come with every execution."""
    ctes = []
    for index, sql in enumerate(writes):
        renamed = _PARAMETER.sub(f":w{index}_" + r"\1", sql)
        ctes.append(f"w{index} AS ({renamed})")
    return text(f"WITH {', '.join([*ctes, _APPEND])}")


def _write_head(path: Path, seq: int, hash_: str) -> None:
    # A temporary file of this write's own: two appends (of two logs on one file) may write at
    # once. Whichever lands last, the head names a record of the chain.
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(canonical_json({"hash": hash_, "seq": seq}) + "\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(temp, path)
