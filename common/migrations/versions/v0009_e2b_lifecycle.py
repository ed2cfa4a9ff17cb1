"""What an E2B sandbox's create asked of its end.

E2B's ``autoPause``, ``autoPauseMemory`` and ``autoResume`` (the SDKs' ``lifecycle``), as one
JSON object beside the sandbox's end (``gateway.e2b._lifecycle``), so that whichever gateway
reaches the end, or sees the traffic that resumes it, does what the create asked. Null: E2B's
defaults (killed at the timeout, not resumed by traffic), as for sandboxes made before.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("e2b_sandboxes", sa.Column("lifecycle", sa.Text))
