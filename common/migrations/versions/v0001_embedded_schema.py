"""The schema of the SQLite files replgate made before Alembic: sessions, history, API keys.

Revision ID: 0001
Revises:
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """The tables as ``gateway/store.py`` created them; timestamps stay ISO 8601 text and the
    JSON columns text, so rows read back as they were written."""
    op.create_table(
        "sessions",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("profile", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.Column("last_active_at", sa.Text, nullable=False),
        sa.Column("execution_count", sa.Integer, nullable=False),
        sa.Column("metadata", sa.Text, nullable=False),
        sa.Column("env", sa.Text, nullable=False),
        sa.Column("sandbox", sa.Text),
        sa.Column("deleted", sa.Integer, nullable=False, server_default="0"),
    )
    op.create_index("sessions_tenant", "sessions", ["tenant", "deleted"])
    op.create_table(
        "executions",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("session_id", sa.Text, nullable=False),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("code", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("execution_count", sa.Integer),
        sa.Column("events", sa.Text, nullable=False),
        sa.Column("result", sa.Text),
        sa.Column("started_at", sa.Text, nullable=False),
        sa.Column("finished_at", sa.Text),
        sa.UniqueConstraint("session_id", "seq"),
    )
    op.create_index("executions_status", "executions", ["status"])
    op.create_table(
        "api_keys",
        sa.Column("key_hash", sa.Text, primary_key=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("created_at", sa.Text, nullable=False),
    )
