"""A session's network policy, kept with its record.

``sessions.network``: the policy (``kernel_pool.NetworkPolicy``) as JSON, so that a
gateway restart, a node move or a recovery applies it again to the session's new proxy. Null:
the profile's own network (its ``egress_allow``), as for sessions made before.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("sessions", sa.Column("network", sa.Text))
