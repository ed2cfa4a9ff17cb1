"""A node's default id: the host name and a suffix drawn once per state folder.

Machines made from one image often share their host name (and their ``/etc/machine-id``), so
the host name alone named two nodes alike. The suffix is drawn at a node's first start and kept
in its state folder (``node-id``), so the id stays the same across its restarts, as its
sessions' placements need, and differs between machines and between state folders of one
machine.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from pathlib import Path

ID_FILE = "node-id"


def default_node_id(state_dir: Path) -> str:
    """The id kept in ``state_dir``, made (``HOSTNAME-xxxxxx``) and kept on the first call."""
    path = state_dir / ID_FILE
    try:
        kept = path.read_text().strip()
    except FileNotFoundError:
        kept = ""
    if kept:
        return kept
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()) or "node"
    made = f"{host}-{secrets.token_hex(3)}"
    state_dir.mkdir(parents=True, exist_ok=True)
    # Written whole or not at all: a start interrupted here must not leave half an id.
    partial = path.with_suffix(".partial")
    partial.write_text(made + "\n")
    os.replace(partial, path)
    return made
