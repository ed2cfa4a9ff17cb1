"""The database's schema, revision by revision (Alembic), applied by :mod:`common.database`."""
