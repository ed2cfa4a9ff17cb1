"""Moved to :mod:`common.tracing` (the node uses it too); re-exported here until the last
importers move."""

from common.tracing import SOCKET_SEND, Tracing, log_ids, setup_tracing, tracing_asked

__all__ = ["SOCKET_SEND", "Tracing", "log_ids", "setup_tracing", "tracing_asked"]
