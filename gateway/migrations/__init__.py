"""The database's schema, revision by revision (Alembic), applied by :mod:`gateway.database`."""
