"""Where replgate keeps its state on this machine. Standard library only: the agents' client
reads it (through :mod:`gateway.local`) and must not need the server's packages."""

from __future__ import annotations

from pathlib import Path


def default_state_dir() -> Path:
    """The state folder when ``REPLGATE_STATE_DIR`` is unset: ``~/.local/state/replgate``."""
    return Path.home() / ".local" / "state" / "replgate"
