"""The one table from domain errors to HTTP statuses: every error has a deliberate answer."""

from __future__ import annotations

import inspect
import re
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy.exc import DBAPIError

import gateway
from common import errors
from common.database import StoreError
from common.errors import GatewayError, status_for
from gateway.errors import close_code_for, headers_for
from kernel_pool import KernelPoolError, NodeRecord, NoNodeAvailable

GATEWAY_DIR = Path(gateway.__file__).parent


def subclasses(base: type[Exception]) -> list[type[Exception]]:
    found, todo = [], [base]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.append(sub)
            todo.append(sub)
    return found


def instance(kind: type[Exception]) -> Exception:
    """An instance whatever the constructor asks: its data is not what maps it."""
    error = Exception.__new__(kind)
    Exception.__init__(error, "a sentence")
    return error


@pytest.mark.parametrize("kind", subclasses(KernelPoolError), ids=lambda k: k.__name__)
def test_every_pool_error_has_a_status(kind: type[Exception]) -> None:
    assert status_for(instance(kind)) != 500


@pytest.mark.parametrize("kind", [StoreError, *subclasses(StoreError)], ids=lambda k: k.__name__)
def test_every_store_error_is_a_client_error_or_unavailable(kind: type[Exception]) -> None:
    status = status_for(instance(kind))
    assert 400 <= status < 500 or status == 503


@pytest.mark.parametrize("kind", subclasses(GatewayError), ids=lambda k: k.__name__)
def test_every_gateway_error_is_a_client_error(kind: type[Exception]) -> None:
    assert 400 <= status_for(instance(kind)) < 500


def test_status_is_chosen_by_class_not_message() -> None:
    from kernel_pool import FileMissing, WorkspaceError

    assert status_for(FileMissing("gone.txt")) == 404
    assert status_for(WorkspaceError("'x' does not exist in the workspace")) == 400


def test_full_database_is_507_with_a_sentence() -> None:
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorcode = sqlite3.SQLITE_FULL  # type: ignore[attr-defined]
    busy = sqlite3.OperationalError("database is locked")
    busy.sqlite_errorcode = sqlite3.SQLITE_BUSY  # type: ignore[attr-defined]

    assert status_for(full) == 507
    assert "state directory is full" in errors.detail_for(full)
    assert status_for(busy) == 503
    assert "retry" in errors.detail_for(busy)
    # as SQLAlchemy hands them on, wrapped
    wrapped = DBAPIError("INSERT ...", None, full)
    assert status_for(wrapped) == 507
    assert "state directory is full" in errors.detail_for(wrapped)
    assert status_for(DBAPIError("SELECT 1", None, busy)) == 503


def test_postgresql_out_of_disk_is_507_and_lost_server_503() -> None:
    import psycopg

    full = psycopg.errors.DiskFull("could not extend file")
    assert full.sqlstate == "53100"
    assert status_for(DBAPIError("INSERT ...", None, full)) == 507
    assert "out of disk space" in errors.detail_for(DBAPIError("INSERT ...", None, full))
    gone = DBAPIError("SELECT 1", None, psycopg.OperationalError("connection refused"))
    assert status_for(gone) == 503
    assert "retry" in errors.detail_for(gone)


def test_unknown_error_is_500() -> None:
    assert status_for(RuntimeError("bug")) == 500


def test_close_codes_mirror_statuses() -> None:
    from kernel_pool import SessionNotFound

    assert close_code_for(SessionNotFound("s")) == 4404
    assert close_code_for(errors.Unauthorized("no key")) == 4401


def test_gateway_errors_take_no_status() -> None:
    assert list(inspect.signature(GatewayError).parameters) == ["detail"]


def test_no_status_code_at_raise_sites() -> None:
    # The client's errors (and the MCP tools, which raise them) stand for an HTTP answer
    # already given: they carry its status by design.
    raise_with_status = re.compile(r"raise \w+\([^)]*\b[45]\d\d\)")
    offenders = [f"{path.relative_to(GATEWAY_DIR)}:{number}"
                 for path in GATEWAY_DIR.rglob("*.py")
                 if not {"client", "mcp"} & set(path.relative_to(GATEWAY_DIR).parts)
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if raise_with_status.search(line)]
    assert offenders == []


def test_no_node_available_is_429_when_every_node_is_full_else_503() -> None:
    def node(node_id: str, state: str, sessions: int) -> NodeRecord:
        return NodeRecord(id=node_id, address="a:1", state=state, kernels=0, max_kernels=2,
                          sessions=sessions, heartbeat_at=datetime.now(UTC).isoformat())

    full = NoNodeAvailable([node("a", "up", 2), node("b", "up", 2)])
    assert status_for(full) == 429
    assert headers_for(status_for(full)) == {"Retry-After": "5"}
    assert "2 full" in str(full) and "REPLGATE_MAX_KERNELS" in str(full)
    assert status_for(NoNodeAvailable([node("a", "up", 2), node("b", "down", 0)])) == 503
    assert status_for(NoNodeAvailable([])) == 503
