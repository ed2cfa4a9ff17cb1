"""E2B's JS SDK (``@e2b/code-interpreter`` from npm, unmodified) under node, against a gateway.

``js/check.mjs`` runs the checks and names the first that fails; ``./run.sh test`` installs
node and the locked packages (``js/package-lock.json``) when they are missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

JS = Path(__file__).parent / "js"


def test_js_sdk_runs_code_files_and_lifecycle(e2b_env: dict[str, str]) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed; ./run.sh test installs Debian's nodejs")
    if not (JS / "node_modules" / "@e2b" / "code-interpreter").is_dir():
        pytest.fail(f"the JS SDK is not installed; run: npm ci --prefix {JS}")
    run = subprocess.run([node, "check.mjs"], cwd=JS, env={**os.environ, **e2b_env},
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ok setTimeout, then kill" in run.stdout
