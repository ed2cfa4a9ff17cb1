"""Custom templates (docs/templates.md): a tenant's image built from a Dockerfile, and its
builds (a rebuild is a new build of the same template) with their logs.

``templates`` holds each template as its latest build left it (a name is unique per tenant;
``public``: published by an operator to every tenant; ``languages``/``lacks`` are JSON lists);
``template_builds`` each build, its outcome and its log (JSON list of lines, written when the
build ends: a build under way is followed in the memory of the gateway running it). Times are
ISO 8601 UTC.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "templates",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("failed_line", sa.Integer),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.Column("updated_at", sa.Text, nullable=False),
        sa.Column("build_id", sa.Text, nullable=False),
        sa.Column("builds", sa.Integer, nullable=False),
        sa.Column("image", sa.Text),
        sa.Column("image_size", sa.BigInteger),
        sa.Column("profile", sa.Text, nullable=False),
        sa.Column("languages", sa.Text, nullable=False),
        sa.Column("lacks", sa.Text, nullable=False),
        sa.Column("public", sa.Integer, nullable=False),
        sa.Column("start_cmd", sa.Text),
        sa.Column("ready_cmd", sa.Text),
    )
    op.create_index("templates_tenant_name", "templates", ["tenant", "name"], unique=True)
    op.create_table(
        "template_builds",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("template_id", sa.Text, nullable=False),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("started_at", sa.Text, nullable=False),
        sa.Column("finished_at", sa.Text),
        sa.Column("log", sa.Text, nullable=False),
    )
    op.create_index("template_builds_template", "template_builds", ["template_id"])
