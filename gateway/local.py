"""The gateway of this machine, as its clients find it: its address, state folder and key file.

``replgate serve`` listens on :data:`DEFAULT_URL` and, without ``REPLGATE_API_KEYS``, writes the
default tenant's key to ``<state folder>/api_key``. ``replgate mcp`` and the Python client
(``Sandbox.create()`` with no arguments) look there, after ``REPLGATE_URL`` and
``REPLGATE_API_KEY``. Standard library only (and :mod:`common.paths`, which is too): the agents'
client imports this module, and must not need the server's packages (pydantic-settings, FastAPI).
"""

from __future__ import annotations

import os
from pathlib import Path

from common.paths import default_state_dir

DEFAULT_URL = "http://127.0.0.1:8000"
"""Where ``replgate serve`` listens unless told otherwise."""
KEY_FILE = "api_key"
"""The default tenant's key, in the state folder (mode 0600)."""


def state_dir() -> Path:
    """``REPLGATE_STATE_DIR``, else :func:`default_state_dir`: the folder ``serve`` uses."""
    configured = os.environ.get("REPLGATE_STATE_DIR")
    return Path(configured) if configured else default_state_dir()


def gateway_url() -> str:
    """``REPLGATE_URL``, else :data:`DEFAULT_URL`, without a trailing slash."""
    return (os.environ.get("REPLGATE_URL") or DEFAULT_URL).rstrip("/")


def stored_api_key() -> str | None:
    """The key ``replgate serve`` created on this machine (``<state folder>/api_key``), if any."""
    try:
        return (state_dir() / KEY_FILE).read_text().strip() or None
    except OSError:
        return None


def api_key() -> str | None:
    """``REPLGATE_API_KEY``, else :func:`stored_api_key`; None when neither gives one."""
    return os.environ.get("REPLGATE_API_KEY") or stored_api_key()
