"""What importing kernel_pool's light parts loads: no Docker SDK, no ZMQ, in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def loaded_after(statement: str) -> set[str]:
    """The top-level modules a fresh interpreter has loaded after running ``statement``."""
    code = f"{statement}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, check=True, timeout=60)
    return {name.split(".")[0] for name in json.loads(done.stdout.splitlines()[-1])}


@pytest.mark.parametrize("statement", [
    "import kernel_pool",
    "import kernel_pool.config",
    "import kernel_pool.state",
    "import kernel_pool.backends.base",
    "from kernel_pool import Execution, PoolSettings, Profile, KernelPoolError",
    "from kernel_pool.config import PoolSettings; PoolSettings(state_dir='/tmp/x')",
])
def test_import_loads_no_docker_nor_zmq(statement: str) -> None:
    loaded = loaded_after(statement)
    assert "docker" not in loaded
    assert "zmq" not in loaded


def test_import_of_the_pool_loads_zmq_but_not_docker() -> None:
    # The Docker SDK comes with the backend, found when a pool is made, not with the pool.
    loaded = loaded_after("from kernel_pool import KernelPool, Session")
    assert "zmq" in loaded
    assert "docker" not in loaded
