"""``from replgate import Sandbox``: the agents' client under the package's name, and how
``Sandbox.create()`` with no arguments finds the gateway of this machine, as ``replgate mcp``
does (REPLGATE_URL and REPLGATE_API_KEY, else the key ``replgate serve`` keeps in its state
folder). Against a real gateway; the default address (127.0.0.1:8000) and the default state
folder are what tests/test_readme.py runs the README's first example on.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp_types import TextContent

import gateway.client
import replgate
from tests.conftest import REPO, GatewayProcess

REPLGATE = Path(sys.executable).with_name("replgate")
SERVER_ONLY = ["docker", "zmq", "jupyter_client", "fastapi", "uvicorn", "aiosqlite", "mcp",
               "pydantic_settings", "gateway.app", "common.settings"]


def test_exports_are_the_clients_under_a_sorted_all() -> None:
    public = sorted(name for name in dir(replgate) if not name.startswith("_"))

    assert replgate.__all__ == sorted(replgate.__all__)
    assert replgate.__all__ == gateway.client.__all__
    assert public == replgate.__all__
    assert all(getattr(replgate, name) is getattr(gateway.client, name)
               for name in replgate.__all__)


def test_import_loads_none_of_the_servers_packages() -> None:
    probe = ("import sys, json\nfrom replgate import Sandbox\n"
             f"print(json.dumps([m for m in {SERVER_ONLY!r} if m in sys.modules]))")

    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                          text=True, check=True, timeout=60)

    assert json.loads(done.stdout) == []


@pytest.fixture
def local_env(gateway: GatewayProcess, tmp_path: Path,
              monkeypatch: pytest.MonkeyPatch) -> Path:
    """This machine's gateway as the environment names it: ``REPLGATE_URL`` set, no
    ``REPLGATE_API_KEY``, and a state folder (returned) holding tenant alpha's key as
    ``serve`` writes it."""
    monkeypatch.setenv("REPLGATE_URL", gateway.url)
    monkeypatch.delenv("REPLGATE_API_KEY", raising=False)
    monkeypatch.setenv("REPLGATE_STATE_DIR", str(tmp_path))
    (tmp_path / "api_key").write_text(gateway.keys["alpha"] + "\n")
    return tmp_path


def test_create_without_arguments_uses_the_key_in_the_state_folder(local_env: Path) -> None:
    with replgate.Sandbox.create() as sbx:
        result = sbx.run_code("print(6 * 7)")
        tenant = sbx.info().tenant

    assert (result.status, result.stdout) == ("ok", "42\n")
    assert tenant == "alpha"


def test_environment_key_comes_before_the_state_folders(
        local_env: Path, gateway: GatewayProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLGATE_API_KEY", gateway.keys["beta"])

    with replgate.Sandbox.create() as sbx:
        tenant = sbx.info().tenant

    assert tenant == "beta"


async def test_replgate_mcp_finds_the_same_key(gateway: GatewayProcess, tmp_path: Path) -> None:
    # The MCP client's configuration without REPLGATE_API_KEY: the stdio server reads the key
    # file of REPLGATE_STATE_DIR, with the code the Python client uses.
    (tmp_path / "api_key").write_text(gateway.keys["beta"] + "\n")
    server = StdioServerParameters(command=str(REPLGATE), args=["mcp"], env={
        "REPLGATE_URL": gateway.url, "REPLGATE_STATE_DIR": str(tmp_path)})

    async with Client(server) as client:
        result = await client.call_tool("execute_python", {"code": "print(6 * 7)"})

    assert not result.is_error
    assert "42" in "".join(b.text for b in result.content if isinstance(b, TextContent))
