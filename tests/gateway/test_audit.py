"""The hash-chained audit log, tampered with through raw SQLite, and log redaction."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.audit import (
    GENESIS_HASH,
    AuditLog,
    VerifyResult,
)
from gateway.audit_records import AuditRecord, canonical_json
from gateway.redaction import RedactSecrets, redact
from gateway.store import Store
from kernel_pool import (
    DisplayEvent,
    DoneEvent,
    ErrorEvent,
    Execution,
    ExecutionStatus,
    ResourceUsage,
    StreamEvent,
)

RECORDS = 5


def _record(n: int, code: str | None = None) -> AuditRecord:
    execution = Execution.from_events([
        StreamEvent(type="stdout", text=f"out {n}\n"),
        DoneEvent(status=ExecutionStatus.OK, execution_count=n, duration_ms=1.0),
    ])
    return AuditRecord.for_execution(
        execution, code=code if code is not None else f"x = {n}", tenant="acme",
        session_id="s1", execution_id=f"e{n}", image="replgate/sandbox:test",
        limits={"memory": "2g"})


@pytest.fixture
async def db_path(tmp_path: Path) -> Path:
    """A database whose audit log holds RECORDS records; closed, ready to tamper with."""
    path = tmp_path / "replgate.db"
    async with Store.open(path) as store:
        audit = await AuditLog.open(store)
        for n in range(1, RECORDS + 1):
            await audit.append(_record(n))
    return path


async def _verify(path: Path, head_path: Path | None = None) -> VerifyResult:
    async with Store.open(path) as store:
        audit = await AuditLog.open(store, head_path=head_path)
        return await audit.verify()


def _tamper(path: Path, *statements: str) -> None:
    raw = sqlite3.connect(path)
    try:
        raw.execute("DROP TRIGGER audit_log_no_update")
        raw.execute("DROP TRIGGER audit_log_no_delete")
        for statement in statements:
            raw.execute(statement)
        raw.commit()
    finally:
        raw.close()


def _problems_about(result: VerifyResult, seq: int) -> list[str]:
    return [p for p in result.problems if p.startswith(f"seq {seq}:")]


@pytest.fixture
async def opened(tmp_path: Path) -> AsyncIterator[tuple[Store, AuditLog]]:
    async with Store.open(tmp_path / "replgate.db") as store:
        yield store, await AuditLog.open(store)


async def test_verify_intact_log_is_ok(db_path: Path) -> None:
    result = await _verify(db_path)
    assert result.ok, result.problems
    assert result.records == RECORDS
    head = json.loads((db_path.parent / "audit.head").read_text())
    assert head == {"seq": RECORDS, "hash": result.last_hash}


async def test_append_chains_from_genesis(opened: tuple[Store, AuditLog]) -> None:
    _, audit = opened
    first = await audit.append(_record(1))
    second = await audit.append(_record(2))
    assert (first.seq, first.prev_hash) == (1, GENESIS_HASH)
    assert first.hash == hashlib.sha256((GENESIS_HASH + first.record).encode()).hexdigest()
    assert (second.seq, second.prev_hash) == (2, first.hash)
    assert first.record == canonical_json(json.loads(first.record))
    assert AuditRecord.model_validate_json(first.record) == _record(1).model_copy(
        update={"time": json.loads(first.record)["time"]})


async def test_append_concurrent_never_forks(opened: tuple[Store, AuditLog]) -> None:
    _, audit = opened
    entries = await asyncio.gather(*(audit.append(_record(n)) for n in range(1, 31)))
    assert sorted(e.seq for e in entries) == list(range(1, 31))
    result = await audit.verify()
    assert result.ok and result.records == 30


async def test_append_cancelled_caller_still_completes(opened: tuple[Store, AuditLog]) -> None:
    _, audit = opened
    task = asyncio.ensure_future(audit.append(_record(1)))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await audit.append(_record(2))
    result = await audit.verify()
    assert result.ok, result.problems
    assert result.records in (1, 2)


async def test_triggers_refuse_update_and_delete(db_path: Path) -> None:
    raw = sqlite3.connect(db_path)
    try:
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            raw.execute("UPDATE audit_log SET record = '{}' WHERE seq = 1")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            raw.execute("DELETE FROM audit_log WHERE seq = 1")
    finally:
        raw.close()
    assert (await _verify(db_path)).ok


async def test_verify_edited_record_names_seq(db_path: Path) -> None:
    _tamper(db_path, "UPDATE audit_log SET record = replace(record, 'x = 3', 'x = 4') "
                     "WHERE seq = 3")
    result = await _verify(db_path)
    assert not result.ok
    assert _problems_about(result, 3)
    assert "edited" in " ".join(_problems_about(result, 3))
    assert result.records == RECORDS


async def test_verify_deleted_middle_row_names_seq(db_path: Path) -> None:
    _tamper(db_path, "DELETE FROM audit_log WHERE seq = 3")
    result = await _verify(db_path)
    assert not result.ok
    assert result.records == RECORDS - 1
    assert any("seq 3 missing" in p for p in _problems_about(result, 4))


async def test_verify_swapped_rows_names_seq(db_path: Path) -> None:
    _tamper(db_path,
            "UPDATE audit_log SET seq = -1 WHERE seq = 2",
            "UPDATE audit_log SET seq = 2 WHERE seq = 3",
            "UPDATE audit_log SET seq = 3 WHERE seq = -1")
    result = await _verify(db_path)
    assert not result.ok
    assert _problems_about(result, 2) and _problems_about(result, 3)
    assert not _problems_about(result, 1)


async def test_verify_deleted_last_row_names_seq(db_path: Path) -> None:
    _tamper(db_path, f"DELETE FROM audit_log WHERE seq = {RECORDS}")
    result = await _verify(db_path)
    assert not result.ok
    assert result.records == RECORDS - 1
    assert any("tail cut off" in p for p in _problems_about(result, RECORDS))


async def test_verify_deleted_last_row_without_head_shows_in_count(db_path: Path) -> None:
    _tamper(db_path, f"DELETE FROM audit_log WHERE seq = {RECORDS}")
    (db_path.parent / "audit.head").unlink()
    result = await _verify(db_path)
    assert not result.ok
    assert result.records == RECORDS - 1
    assert any("audit.head is missing" in p for p in result.problems)


async def test_verify_rewritten_chain_caught_by_head(db_path: Path) -> None:
    # Edit a record and recompute every hash after it: the chain is valid again, the head not.
    _tamper(db_path, "UPDATE audit_log SET record = replace(record, 'x = 2', 'x = 9') "
                     "WHERE seq = 2")
    raw = sqlite3.connect(db_path)
    prev = GENESIS_HASH
    for seq, record in raw.execute("SELECT seq, record FROM audit_log ORDER BY seq").fetchall():
        digest = hashlib.sha256((prev + record).encode()).hexdigest()
        raw.execute("UPDATE audit_log SET prev_hash = ?, hash = ? WHERE seq = ?",
                    (prev, digest, seq))
        prev = digest
    raw.commit()
    raw.close()
    result = await _verify(db_path)
    assert not result.ok
    assert any("rewritten" in p for p in _problems_about(result, RECORDS))


async def test_verify_head_lagging_one_record_is_ok(db_path: Path) -> None:
    # A crash between the row's commit and the head's update leaves the head one behind.
    raw = sqlite3.connect(db_path)
    (hash_,) = raw.execute("SELECT hash FROM audit_log WHERE seq = ?", (RECORDS - 1,)).fetchone()
    raw.close()
    (db_path.parent / "audit.head").write_text(canonical_json({"hash": hash_,
                                                                "seq": RECORDS - 1}))
    result = await _verify(db_path)
    assert result.ok, result.problems


async def test_append_after_cut_tail_keeps_evidence(db_path: Path) -> None:
    _tamper(db_path, f"DELETE FROM audit_log WHERE seq = {RECORDS}")
    async with Store.open(db_path) as store:
        audit = await AuditLog.open(store)
        entry = await audit.append(_record(RECORDS + 1))
        result = await audit.verify()
    assert entry.seq == RECORDS + 1
    assert not result.ok
    assert any(f"seq {RECORDS} missing" in p for p in _problems_about(result, RECORDS + 1))


async def test_export_lines_recompute_chain(db_path: Path, tmp_path: Path) -> None:
    async with Store.open(db_path) as store:
        audit = await AuditLog.open(store)
        stream = io.StringIO()
        assert await audit.export(stream) == RECORDS
        out = tmp_path / "export.jsonl"
        assert await audit.export(out, batch=2) == RECORDS
    assert out.read_text() == stream.getvalue()
    prev = GENESIS_HASH
    lines = stream.getvalue().splitlines()
    assert len(lines) == RECORDS
    for seq, line in enumerate(lines, start=1):
        entry = json.loads(line)
        assert entry["seq"] == seq and entry["prev_hash"] == prev
        digest = hashlib.sha256((prev + canonical_json(entry["record"])).encode()).hexdigest()
        assert digest == entry["hash"]
        prev = digest


async def test_append_output_looking_like_records_stays_one_record(
    opened: tuple[Store, AuditLog],
) -> None:
    _, audit = opened
    forged = '\n{"seq":2,"hash":"' + "0" * 64 + '","record":{}}\n'
    execution = Execution.from_events([
        StreamEvent(type="stdout", text=forged),
        DoneEvent(status=ExecutionStatus.OK, execution_count=1, duration_ms=1.0),
    ])
    code = f"print({forged!r})  # sk-{'a' * 30}"
    await audit.append(AuditRecord.for_execution(
        execution, code=code, tenant="acme", session_id="s1", execution_id="e1"))
    stream = io.StringIO()
    assert await audit.export(stream) == 1
    assert len(stream.getvalue().splitlines()) == 1
    record = json.loads(stream.getvalue())["record"]
    assert record["code"] == code  # kept verbatim: never redacted
    assert record["stdout_chars"] == len(forged)


def test_for_execution_fills_fields() -> None:
    execution = Execution.from_events([
        StreamEvent(type="stdout", text="héllo"),
        StreamEvent(type="stderr", text="warn"),
        DisplayEvent(type="display", data={"text/plain": "p", "image/png": "iVBOR"}),
        DisplayEvent(type="result", data={"text/plain": "42"}),
        ErrorEvent(ename="ValueError", evalue="bad", traceback=["tb"]),
        DoneEvent(status=ExecutionStatus.ERROR, execution_count=7, duration_ms=12.5,
                  metrics=ResourceUsage(cpu_time_ms=3.0, peak_memory_bytes=1024)),
    ])
    record = AuditRecord.for_execution(
        execution, code="print('héllo')", tenant="acme", session_id="s1",
        execution_id="e7", image="img@sha256:ab", limits={"cpus": 1.0},
        time="2024-01-01T00:00:00+00:00", extra={"policy": "allow"})
    shown = canonical_json({
        "stdout": "héllo", "stderr": "warn",
        "outputs": [o.model_dump(mode="json") for o in execution.outputs],
        "error": {"ename": "ValueError", "evalue": "bad", "traceback": ["tb"], "text": "tb",
                  "short": "tb"},
    })
    assert record.status == "error" and record.execution_count == 7
    assert record.code_sha256 == hashlib.sha256("print('héllo')".encode()).hexdigest()
    assert (record.stdout_chars, record.stderr_chars, record.output_count) == (5, 4, 2)
    assert record.output_sha256 == hashlib.sha256(shown.encode()).hexdigest()
    assert record.output_bytes == len(shown.encode())
    assert (record.cpu_time_ms, record.peak_memory_bytes, record.duration_ms) == (3.0, 1024, 12.5)
    assert record.image == "img@sha256:ab" and record.limits == {"cpus": 1.0}
    assert record.extra == {"policy": "allow"}
    assert record.canonical().isascii()


def test_for_execution_hashes_lone_surrogate_code() -> None:
    execution = Execution(status=ExecutionStatus.OK)
    record = AuditRecord.for_execution(execution, code="'\ud800'", tenant="t",
                                       session_id="s", execution_id="e")
    assert len(record.code_sha256) == 64
    assert "\\ud800" in record.canonical()


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("Authorization: Bearer rg_abcdefghijklmnopqrstuvwxyz0123", "rg_abcdefghij"),
        ("authorization: token 0123456789abcdef0123", "0123456789abcdef"),
        ("GET /v1/sessions/x/ws?token=shortkey&x=1", "shortkey"),
        ("key rg_AbCdEfGhIjKlMnOpQrStUv_-xyz appeared", "rg_AbCdEf"),
        ("sent e2b_0123456789abcdef0123456789abcdef as its key", "e2b_0123456789"),
        ("openai sk-proj-abcdefghijklmnop1234 leaked", "sk-proj-abcdef"),
        ("aws AKIAIOSFODNN7EXAMPLE id", "AKIAIOSFODNN7EXAMPLE"),
        ("aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI"),
        ("password=hunter2 user=bob", "hunter2"),
        ('{"key": "a0b1c2d3e4f5a6b7c8d9e0f1"}', "a0b1c2d3e4f5"),
        ("secret: c2VjcmV0c2VjcmV0c2VjcmV0", "c2VjcmV0c2Vj"),
        ("ghp_abcdefghijklmnopqrstuvwxyz012345", "ghp_abcdef"),
    ],
)
def test_redact_removes_secret(text: str, secret: str) -> None:
    redacted = redact(text)
    assert secret not in redacted
    assert "[REDACTED]" in redacted


@pytest.mark.parametrize(
    "text",
    ["session s1 executed 3 cells", "key=name status=ok", "GET /healthz 200",
     "token expired for tenant acme"],
)
def test_redact_leaves_ordinary_text(text: str) -> None:
    assert redact(text) == text


def test_redact_secrets_filter_redacts_args_and_traceback() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactSecrets())
    log = logging.getLogger("test_audit.redaction")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("auth header %s", "Bearer rg_abcdefghijklmnopqrstuvwxyz")
        try:
            raise RuntimeError("bad key sk-abcdefghijklmnopqrstuvwx")
        except RuntimeError:
            log.exception("failed")
    finally:
        log.removeHandler(handler)
    out = stream.getvalue()
    assert "rg_abcdefghijklmnopqrstuvwxyz" not in out
    assert "sk-abcdefghijklmnopqrstuvwx" not in out
    assert "auth header Bearer [REDACTED]" in out
    assert "RuntimeError" in out


async def test_verify_unreadable_head_is_reported(db_path: Path) -> None:
    (db_path.parent / "audit.head").write_text("not json")
    result = await _verify(db_path)
    assert not result.ok
    assert any("unreadable" in p for p in result.problems)
