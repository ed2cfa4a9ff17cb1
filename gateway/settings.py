"""Moved to :mod:`common.settings` (the node reads them too); re-exported here until the last
importers move."""

from common.settings import ENV_PREFIX, FLAT_NAMES, Settings

__all__ = ["ENV_PREFIX", "FLAT_NAMES", "Settings"]
