"""PostgreSQL tells every gateway when a session's placement changes.

A gateway of many machines finds each request's session in the shared database (where it
runs, whether it still exists): a read of about 0.7 ms on every request. With this trigger,
an update of a session's node, epoch or deletion sends a notice on ``replgate_sessions``
(its id), and a gateway that listens keeps what it read until told otherwise
(``node.records``). SQLite has no such notices, and needs none: its file is one gateway's.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        "CREATE FUNCTION sessions_placement_notice() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN PERFORM pg_notify('replgate_sessions', NEW.id); RETURN NULL; END $$")
    op.execute(
        "CREATE TRIGGER sessions_placement_changed AFTER UPDATE ON sessions FOR EACH ROW "
        "WHEN (OLD.node IS DISTINCT FROM NEW.node OR OLD.epoch IS DISTINCT FROM NEW.epoch "
        "OR OLD.deleted IS DISTINCT FROM NEW.deleted) "
        "EXECUTE FUNCTION sessions_placement_notice()")

