"""When a node last had a slot claimed on it, so that its heartbeat does not undo a claim.

A gateway claims a slot (``nodes.sessions + 1``) before it asks the node for the session; the
node's heartbeat reports the sessions it runs, which do not count one still being made. The
heartbeat lowers the count to its own only once no claim is recent (``node.registry``).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("nodes", sa.Column("claimed_at", sa.Text))
