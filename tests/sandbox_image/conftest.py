"""The sandbox's own modules, tested on the host with the dev venv's libraries."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sandbox_image"))
