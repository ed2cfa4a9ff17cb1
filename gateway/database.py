"""Moved to :mod:`common.database` (the node uses it too); re-exported here until the last
importers move."""

from common.database import (
    LEGACY_REVISION,
    Database,
    DatabaseError,
    StoreError,
    Write,
    alembic_config,
    database_url,
)

__all__ = ["LEGACY_REVISION", "Database", "DatabaseError", "StoreError", "Write",
           "alembic_config", "database_url"]
