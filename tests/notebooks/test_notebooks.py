"""The example notebooks run top to bottom with nbclient against a real gateway, outputs checked.

They run on a host kernel of this virtualenv (its ipykernel, installed as a kernelspec of its
own for the test), which reaches the gateway through ``gateway.client`` with REPLGATE_URL and
REPLGATE_API_KEY from the environment, as a user's notebook server would.
"""

from __future__ import annotations

import base64
import csv
import re
from pathlib import Path
from typing import Any

import httpx
import nbformat
import pytest
from ipykernel.kernelspec import install as install_kernelspec
from nbclient import NotebookClient

from tests.conftest import REPO, GatewayProcess

NOTEBOOKS = REPO / "notebooks"
KERNEL = "replgate-test-venv"


@pytest.fixture
def notebook_env(gateway: GatewayProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A kernelspec of this virtualenv's Python, and the gateway's address and key to inherit."""
    prefix = tmp_path / "prefix"
    install_kernelspec(kernel_name=KERNEL, display_name="replgate test venv", prefix=str(prefix))
    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
    monkeypatch.setenv("REPLGATE_URL", gateway.url)
    monkeypatch.setenv("REPLGATE_API_KEY", gateway.keys["alpha"])
    return KERNEL


async def run_notebook(name: str, kernel: str) -> dict[str, Any]:
    """Execute ``notebooks/<name>`` in its folder; its code cells by their tag."""
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)  # type: ignore[no-untyped-call]
    client = NotebookClient(notebook, kernel_name=kernel, timeout=120,
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    await client.async_execute()
    cells = {cell.metadata["tags"][0]: cell for cell in notebook.cells
             if cell.cell_type == "code"}
    for tag, cell in cells.items():
        assert not [o for o in cell.outputs if o.output_type == "error"], tag
    return cells


def stdout(cell: Any) -> str:
    return "".join(output.text for output in cell.outputs
                   if output.output_type == "stream" and output.name == "stdout")


async def session_ids(gateway: GatewayProcess) -> set[str]:
    async with httpx.AsyncClient(base_url=gateway.url, headers=gateway.headers()) as http:
        return {session["id"] for session in (await http.get("/v1/sessions")).json()}


async def test_quickstart_runs_top_to_bottom(notebook_env: str, gateway: GatewayProcess) -> None:
    cells = await run_notebook("quickstart.ipynb", notebook_env)

    session_id = re.search(r"<Sandbox ([\w-]+) ", stdout(cells["connect"]))
    assert session_id is not None
    assert stdout(cells["state"]) == "ok area = 12.566\n"
    streamed = stdout(cells["stream"])  # each print reaches on_stdout whole, as one line
    assert [line for line in streamed.splitlines() if "step" in line] == [
        "live: step 0", "live: step 1", "live: step 2"]
    assert streamed.endswith("error KeyError 'b'\n")
    [plot] = [o for o in cells["plot"].outputs if o.output_type == "display_data"]
    assert base64.b64decode(plot.data["image/png"]).startswith(b"\x89PNG")
    files = stdout(cells["files"])
    assert "data/numbers.csv" in files and "summary.csv" in files
    assert files.endswith(",x,y\n")
    assert stdout(cells["notebook"]) == "6 cells exported\nfirst cell: import math\n"
    assert stdout(cells["close"]) == "closed\n"
    assert session_id[1] not in await session_ids(gateway)


def best_region() -> tuple[str, float]:
    """The answer to the agent's task, worked out here without pandas."""
    totals: dict[str, float] = {}
    with open(NOTEBOOKS / "data" / "sales.csv", newline="") as f:
        for row in csv.DictReader(f):
            totals[row["region"]] = totals.get(row["region"], 0.0) + float(row["revenue_usd"])
    region = max(totals, key=lambda name: totals[name])
    return region, round(totals[region], 2)


async def test_agent_loop_fixes_key_error_on_second_attempt(notebook_env: str,
                                                            gateway: GatewayProcess) -> None:
    before = await session_ids(gateway)

    cells = await run_notebook("agent_loop.ipynb", notebook_env)

    loop = stdout(cells["loop"])
    region, total = best_region()
    first, second = loop.split("--- attempt 2: ran\n")
    assert first.startswith("--- attempt 1: failed\n[error]\n")
    assert "KeyError" in first and "[status: error]" in first and "\x1b[" not in first
    assert "revenue_usd" in second  # the schema it read
    assert f"ANSWER: {region} {total:.2f}" in second
    assert loop.endswith(
        "attempts: 2, stopped: answered\n"
        f"final answer: {region} brought in the most revenue: ${total:,.2f}.\n")
    assert stdout(cells["close"]) == "session closed\n"
    assert await session_ids(gateway) <= before
