"""Tenants' secrets: a name per tenant and its value sealed with AES-GCM (gateway/secrets.py).

The value is never stored in the clear: ``sealed`` is base64 of a random nonce and the
AES-256-GCM ciphertext under a key derived from ``REPLGATE_SECRETS_KEY``, bound to the tenant
and the name (a row copied to another tenant or name does not open). Times are ISO 8601 UTC.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "secrets",
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("sealed", sa.Text, nullable=False),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.Column("updated_at", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("tenant", "name"),
    )
