"""The audit head keeps the hash before its last move.

On PostgreSQL an audit append is one statement (``gateway.audit``): it moves the head and adds
the record, and the record's ``prev_hash`` is the head's hash before the move. An UPDATE's
RETURNING shows only the row after it (before PostgreSQL 18), so the move keeps that hash in
the row itself. Null until the first append after this migration; SQLite's appends, which
read the head first, leave it so.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("audit_head", sa.Column("prev_hash", sa.Text))
