"""Shared state for many gateways: the audit chain and its head in the database, sessions'
placement (node, epoch), and the nodes.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

GENESIS_HASH = "0" * 64

_SQLITE_TRIGGERS = (
    "CREATE TRIGGER IF NOT EXISTS audit_log_no_update BEFORE UPDATE ON audit_log "
    "BEGIN SELECT RAISE(ABORT, 'audit_log is append-only: UPDATE refused'); END",
    "CREATE TRIGGER IF NOT EXISTS audit_log_no_delete BEFORE DELETE ON audit_log "
    "BEGIN SELECT RAISE(ABORT, 'audit_log is append-only: DELETE refused'); END",
)
_POSTGRESQL_TRIGGERS = (
    "CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ "
    "BEGIN RAISE EXCEPTION 'audit_log is append-only: % refused', TG_OP; END $$",
    "CREATE TRIGGER audit_log_no_update BEFORE UPDATE OR DELETE ON audit_log "
    "FOR EACH ROW EXECUTE FUNCTION audit_log_append_only()",
    "CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log "
    "FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only()",
)


def upgrade() -> None:
    bind = op.get_bind()
    if "audit_log" not in sa.inspect(bind).get_table_names():
        # (A SQLite file of the embedded store may have it already, made by gateway/audit.py.)
        op.create_table(
            "audit_log",
            sa.Column("seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"),
                      primary_key=True, autoincrement=False),
            sa.Column("record", sa.Text, nullable=False),
            sa.Column("prev_hash", sa.Text, nullable=False),
            sa.Column("hash", sa.Text, nullable=False),
        )
    for statement in (_POSTGRESQL_TRIGGERS if bind.dialect.name == "postgresql"
                      else _SQLITE_TRIGGERS):
        op.execute(statement)
    # The chain's end, one row: appending gateways lock it (FOR UPDATE, or SQLite's write lock),
    # read where the chain ends, and move it in the transaction that adds the record.
    head = op.create_table(
        "audit_head",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("hash", sa.Text, nullable=False),
        sa.CheckConstraint("id = 1", name="audit_head_one_row"),
    )
    last = bind.execute(sa.text(
        "SELECT seq, hash FROM audit_log ORDER BY seq DESC LIMIT 1")).first()
    op.bulk_insert(head, [{"id": 1, "seq": last[0] if last else 0,
                           "hash": last[1] if last else GENESIS_HASH}])

    # Where a session runs: the node (null while paused or before placement), and an epoch that
    # each new placement raises, so a node that lost a session (a partition, a restart) is
    # refused when it acts on it with the old one.
    op.add_column("sessions", sa.Column("node", sa.Text))
    op.add_column("sessions", sa.Column("epoch", sa.Integer, nullable=False,
                                        server_default="0"))
    op.create_index("sessions_node", "sessions", ["node"])
    # The machines that run sessions (``replgate node``), as GET /v1/nodes shows them.
    op.create_table(
        "nodes",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("address", sa.Text, nullable=False),
        sa.Column("state", sa.Text, nullable=False, server_default="up"),
        sa.Column("kernels", sa.Integer, nullable=False, server_default="0"),
        sa.Column("max_kernels", sa.Integer, nullable=False, server_default="0"),
        sa.Column("sessions", sa.Integer, nullable=False, server_default="0"),
        sa.Column("heartbeat_at", sa.Text, nullable=False),
        sa.CheckConstraint("state IN ('up', 'draining', 'down')", name="nodes_state"),
    )
