"""Moved to :mod:`common.metrics` (the node uses it too); re-exported here until the last
importers move."""

from common.metrics import Metrics

__all__ = ["Metrics"]
