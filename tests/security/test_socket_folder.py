"""The kernel's socket folder is writable by the sandbox: nothing planted there reaches the host."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import httpx

from tests.conftest import GatewayProcess


def test_symlinked_connection_file_does_not_write_host_file(gateway: GatewayProcess) -> None:
    canary = Path(tempfile.mkdtemp(prefix="rg-canary-")) / "host-file.txt"
    canary.write_text("host content")
    os.chmod(canary, 0o644)
    with httpx.Client(base_url=gateway.url, headers=gateway.headers(), timeout=120) as c:
        sid = c.post("/v1/sessions", json={}).json()["id"]
        try:
            # The next kernel's connection file will be k2.json (then k3.json): plant links.
            plant = (f"import os\nfor n in range(2, 6):\n"
                     f"    os.symlink({str(canary)!r}, f'/kernel/k{{n}}.json')\nprint('planted')")
            assert c.post(f"/v1/sessions/{sid}/execute", json={"code": plant}).json()[
                "stdout"] == "planted\n"
            assert c.post(f"/v1/sessions/{sid}/restart").status_code == 200
            result = c.post(f"/v1/sessions/{sid}/execute", json={"code": "print('alive')"})
            assert result.json()["stdout"] == "alive\n"
        finally:
            c.delete(f"/v1/sessions/{sid}")
    assert canary.read_text() == "host content"
    assert canary.stat().st_uid == 0 and canary.stat().st_mode & 0o777 == 0o644
