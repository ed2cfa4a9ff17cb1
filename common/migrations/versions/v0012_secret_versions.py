"""Secrets' versions and metadata, for E2B's secrets API (gateway/e2b/_secrets.py).

``version`` counts a secret's values (1 when stored, one more at each replacement: E2B's
``currentVersion``); ``metadata`` is the tenant's labels for it, a JSON object of strings
(E2B's ``metadata``). Neither holds anything of the value, which stays sealed in ``sealed``.

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
    op.add_column("secrets", sa.Column("version", sa.Integer, nullable=False,
                                       server_default="1"))
    op.add_column("secrets", sa.Column("metadata", sa.Text, nullable=False,
                                       server_default="{}"))
