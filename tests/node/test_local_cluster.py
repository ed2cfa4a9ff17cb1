"""``replgate cluster`` (``./run.sh cluster``): what it says when it cannot start."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def test_a_taken_gateway_port_stops_the_cluster_before_it_starts_anything(tmp_path: Path) -> None:
    with socket.socket() as taken:  # as a gateway of ./run.sh serve holds 8000
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "gateway.cli", "cluster", "--port", str(port),
             "--dir", str(tmp_path / "cluster"), "--database-url",
             "postgresql://nobody@127.0.0.1:1/unused"],
            cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert f"port {port} of gateway-1 is taken" in done.stderr
    assert "gateway http://" not in done.stdout and "Ctrl-C" not in done.stdout
    assert not list((tmp_path / "cluster").glob("*.log")), "a member was started"
