"""Alembic's environment: migrations run on the connection :mod:`common.database` hands over,
inside the transaction (and lock) it holds, never on a connection of their own."""

from __future__ import annotations

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
