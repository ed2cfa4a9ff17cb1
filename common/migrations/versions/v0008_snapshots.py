"""Saved snapshots (E2B's ``create_snapshot``): what each one is, whose, and what it takes.

The snapshot itself (variables and files) is a bundle in the bundle store
(``kernel_pool._pool_snapshots``); its row says who may make sessions from it, from which
profile and environment, and counts it against the tenant's quotas. A name is unique per
tenant (a new snapshot of the same name takes it over). Times are ISO 8601 UTC strings.

Revision ID: 0008
Revises: 0006
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "snapshots",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("name", sa.Text),
        sa.Column("session_id", sa.Text, nullable=False),
        sa.Column("profile", sa.Text, nullable=False),
        sa.Column("env", sa.Text, nullable=False),
        sa.Column("memory", sa.Integer, nullable=False),
        sa.Column("kept", sa.Text, nullable=False),
        sa.Column("not_kept", sa.Text, nullable=False),
        sa.Column("size_bytes", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.Text, nullable=False),
    )
    op.create_index("snapshots_tenant_created", "snapshots", ["tenant", "created_at"])
    op.create_index("snapshots_tenant_name", "snapshots", ["tenant", "name"], unique=True)
