"""E2B's face of custom templates (docs/e2b.md): its build ids and tags, kept where every gateway
and a restarted one read them.

``e2b_template_builds`` each build E2B's SDK asked (``build_id`` E2B's UUID; ``core`` the
replgate build it started, NULL while it waits for its steps; ``steps`` a JSON list of E2B's
step of each Dockerfile line, to name a failed step). ``e2b_template_tags`` each tag of a
template (``alias``: its name) and the build it names. Times are ISO 8601 UTC.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "e2b_template_builds",
        sa.Column("build_id", sa.Text, primary_key=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("alias", sa.Text, nullable=False),
        sa.Column("cpu_count", sa.Integer, nullable=False),
        sa.Column("memory_mb", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.Column("core", sa.Text),
        sa.Column("steps", sa.Text),
    )
    op.create_index("e2b_template_builds_alias", "e2b_template_builds", ["tenant", "alias"])
    op.create_table(
        "e2b_template_tags",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("alias", sa.Text, primary_key=True),
        sa.Column("tag", sa.Text, primary_key=True),
        sa.Column("build_id", sa.Text, nullable=False),
        sa.Column("created_at", sa.Text, nullable=False),
    )

