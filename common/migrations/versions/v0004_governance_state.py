"""Governance and E2B state that every gateway shares: approvals, budgets' use, sandbox ends.

On many machines an execution held through one gateway is decided through another, a session
used through two counts each execution once, and a sandbox's E2B timeout is enforced by
whichever gateway is there when it ends: each needs its state in the database, not in the
memory of the gateway that made it.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # An execution held for a person's decision, and what became of it. Times are ISO 8601 UTC
    # strings with microseconds, so they compare as text.
    op.create_table(
        "approvals",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("session_id", sa.Text, nullable=False),
        sa.Column("execution_id", sa.Text, nullable=False),
        sa.Column("code", sa.Text, nullable=False),
        sa.Column("rules", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.Column("expires_at", sa.Text, nullable=False),
        sa.Column("decided_by", sa.Text),
        sa.Column("decided_at", sa.Text),
        sa.Column("comment", sa.Text),
        sa.CheckConstraint(
            "status IN ('pending', 'approved', 'rejected', 'expired', 'withdrawn')",
            name="approvals_status"),
    )
    op.create_index("approvals_tenant_status", "approvals", ["tenant", "status"])
    # What each session with a budget has used, whichever gateway ran its executions.
    op.create_table(
        "session_usage",
        sa.Column("session_id", sa.Text, primary_key=True),
        sa.Column("executions", sa.Integer, nullable=False),
        sa.Column("wall_s", sa.Float, nullable=False),
        sa.Column("cpu_s", sa.Float, nullable=False),
    )
    # An E2B sandbox's end (its timeout); null while the SDK has it paused (it does not end).
    op.create_table(
        "e2b_sandboxes",
        sa.Column("session_id", sa.Text, primary_key=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("end_at", sa.Text),
    )
    op.create_index("e2b_sandboxes_end_at", "e2b_sandboxes", ["end_at"])
