"""What agents read beside the outputs, through a running gateway: charts as data, the files a
cell touched, plain tracebacks; over HTTP, the WebSocket and the client's text rendering."""

from __future__ import annotations

import json

import httpx
import pytest
from websockets.asyncio.client import connect

from gateway.client import Execution, render_execution
from tests.conftest import GatewayProcess
from tests.gateway.test_ws import collect, ws_url

PANDAS_KEY_ERROR = ("import pandas as pd\n"
                    "df = pd.DataFrame({'a': [1, 2]})\n"
                    "def total(frame):\n"
                    "    return frame['amount'].sum()\n"
                    "total(df)")
PIE = ("import matplotlib.pyplot as plt\n"
       "fig, ax = plt.subplots()\n"
       "ax.pie([30, 70], labels=['cats', 'dogs'])\n"
       "ax.set_title('Pets')\n"
       "plt.show()")


def execute(client: httpx.Client, session_id: str, code: str) -> dict[str, object]:
    answer = client.post(f"/v1/sessions/{session_id}/execute", json={"code": code})
    assert answer.status_code == 200, answer.text
    result: dict[str, object] = answer.json()
    return result


def test_http_execution_carries_chart_beside_png(alpha: httpx.Client, session_id: str) -> None:
    result = execute(alpha, session_id, PIE)
    (figure,) = result["outputs"]  # type: ignore[misc]
    assert "image/png" in figure["data"]
    chart = figure["chart"]
    assert (chart["type"], chart["title"]) == ("pie", "Pets")
    assert [(e["label"], round(e["angle"])) for e in chart["elements"]] == [
        ("cats", 108), ("dogs", 252)]


def test_http_execution_lists_files_touched(alpha: httpx.Client, session_id: str) -> None:
    alpha.put(f"/v1/sessions/{session_id}/files/uploaded.csv", content=b"a\n1\n")
    result = execute(alpha, session_id, "import os\nopen('made.txt', 'w').write('hello')\n"
                                 "os.remove('uploaded.csv')")
    assert result["files"] == [
        {"path": "made.txt", "size": 5, "change": "created"},
        {"path": "uploaded.csv", "size": None, "change": "deleted"}]


def test_http_execution_error_has_plain_text(alpha: httpx.Client, session_id: str) -> None:
    result = execute(alpha, session_id, "import json\njson.loads('{bad')")
    error = result["error"]
    assert any("\x1b[" in line for line in error["traceback"])  # type: ignore[index]
    assert "\x1b" not in error["text"]  # type: ignore[index]
    assert "JSONDecodeError" in error["text"]  # type: ignore[index]
    assert "json.loads('{bad')" in error["text"]  # type: ignore[index]


def test_http_execution_error_has_short_form_of_the_users_frames(alpha: httpx.Client,
                                                               session_id: str) -> None:
    error = execute(alpha, session_id, PANDAS_KEY_ERROR)["error"]
    text, short = error["text"], error["short"]  # type: ignore[index]
    assert "site-packages/pandas" in text  # the whole traceback, as before
    assert short.startswith("[... 1 chained exception in library code]\n\nCell In[")
    assert "----> 5 total(df)" in short and "----> 4     return frame['amount'].sum()" in short
    assert "frames in library code]" in short and "site-packages" not in short
    assert short.endswith("KeyError: 'amount'")
    assert len(short) < len(text) / 3
    assert "network" not in short


@pytest.mark.parametrize("code", [
    "import requests\nrequests.get('https://example.com/data.csv', timeout=5)",
    "import socket\nsocket.create_connection(('192.0.2.1', 80), timeout=5)",
])
def test_http_execution_network_error_says_the_sandbox_has_none(alpha: httpx.Client,
                                                               session_id: str,
                                                               code: str) -> None:
    error = execute(alpha, session_id, code)["error"]
    assert error["short"].endswith(  # type: ignore[index]
        "\n\n[no network] The sandbox has no network access: host names do not resolve and "
        "connections fail, so retrying will not help. Work with files in the workspace "
        "instead (they can be uploaded to it).")
    assert "Cell In[" in error["short"]  # type: ignore[index]
    assert "[no network]" not in error["text"]  # type: ignore[index]


async def test_ws_events_carry_chart_files_and_text(gateway: GatewayProcess,
                                                   session_id: str) -> None:
    code = PIE + "\nopen('ws.txt', 'w').write('x')\nraise RuntimeError('after the plot')"
    async with connect(ws_url(gateway, session_id), additional_headers=gateway.headers()) as ws:
        await ws.send(json.dumps({"type": "execute", "code": code, "id": "results-1"}))
        frames = await collect(ws, "results-1")
    by_type = {frame["type"]: frame for frame in frames}
    assert by_type["display"]["chart"]["type"] == "pie"
    assert "RuntimeError: after the plot" in by_type["error"]["text"]
    assert by_type["error"]["short"].startswith("Cell In[")
    assert by_type["error"]["short"].endswith("RuntimeError: after the plot")
    assert by_type["done"]["files"] == [{"path": "ws.txt", "size": 1, "change": "created"}]


def test_client_rendering_shows_chart_data_files_and_plain_traceback(alpha: httpx.Client,
                                                                     session_id: str) -> None:
    execution = Execution.model_validate(execute(
        alpha, session_id, PIE + "\nopen('render.txt', 'w').write('abc')\n1 / 0"))
    text = render_execution(execution).text
    assert '"type":"pie"' in text and '"label":"cats"' in text
    assert "created render.txt (3 bytes)" in text
    assert "ZeroDivisionError" in text and "\x1b" not in text


def test_client_rendering_shows_the_short_traceback(alpha: httpx.Client,
                                                    session_id: str) -> None:
    execution = Execution.model_validate(execute(alpha, session_id, PANDAS_KEY_ERROR))
    assert execution.error is not None
    text = render_execution(execution).text
    assert f"[error]\n{execution.error.short}\n" in text
    assert "site-packages" not in text


def test_notebook_export_keeps_chart_and_files(alpha: httpx.Client, session_id: str) -> None:
    execute(alpha, session_id, PIE + "\nopen('nb.txt', 'w').write('n')")
    notebook = alpha.get(f"/v1/sessions/{session_id}/notebook").json()
    cell = notebook["cells"][-1]
    (figure,) = [o for o in cell["outputs"] if "image/png" in o.get("data", {})]
    assert figure["data"]["application/vnd.replgate.chart+json"]["type"] == "pie"
    assert cell["metadata"]["replgate"]["files"] == [
        {"path": "nb.txt", "size": 1, "change": "created"}]
