"""replgate's gateway: the HTTP, WebSocket, Jupyter and MCP service in front of the pool."""

from importlib.metadata import version

__version__ = version("replgate")
"""The installed distribution's version (read once: a metadata lookup scans sys.path)."""
