"""``replgate mcp`` through the MCP SDK's own client, over both transports against a real gateway.

- stdio: the ``replgate mcp`` console script, configured as an MCP client would (command, args,
  env with REPLGATE_URL and REPLGATE_API_KEY);
- HTTP: streamable HTTP at ``/mcp`` on the gateway with a Bearer key.

Most tests share one connection (so one sandbox session) per transport; those about a
connection's lifetime open their own.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, ImageContent, TextContent

from tests.conftest import GatewayProcess

REPLGATE = Path(sys.executable).with_name("replgate")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TOOLS = ["execute_python", "execute_code", "upload_file", "read_file", "list_files",
         "restart_kernel", "export_notebook", "run_shell", "fork_session",
         "network_policy"]
MCP_HEADERS = {"Accept": "application/json, text/event-stream",
               "Content-Type": "application/json"}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {},
    "clientInfo": {"name": "test", "version": "0"}}}


def stdio_config(gateway: GatewayProcess, tenant: str = "alpha") -> dict[str, Any]:
    """The MCP client configuration the README gives for stdio."""
    return {"command": str(REPLGATE), "args": ["mcp"],
            "env": {"REPLGATE_URL": gateway.url, "REPLGATE_API_KEY": gateway.keys[tenant]}}


@asynccontextmanager
async def connect(transport: str, gateway: GatewayProcess,
                  tenant: str = "alpha") -> AsyncIterator[Client]:
    """An MCP client session over ``transport``, as a user's MCP client would open it."""
    if transport == "stdio":
        async with Client(StdioServerParameters(**stdio_config(gateway, tenant))) as client:
            yield client
        return
    http = httpx2.AsyncClient(headers=gateway.headers(tenant),
                              timeout=httpx2.Timeout(30, read=300))
    async with http, Client(streamable_http_client(f"{gateway.url}/mcp",
                                                   http_client=http)) as client:
        yield client


class Held:
    """A connection opened and closed by a task of its own: the SDK's cancel scopes must be
    left by the task that entered them, and a module fixture's set-up and teardown may not
    share one."""

    def __init__(self, opener: AbstractAsyncContextManager[Client]) -> None:
        self._opener = opener
        self._ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._hold())

    async def _hold(self) -> None:
        try:
            async with self._opener as client:
                self._ready.set_result(client)
                await self._stop.wait()
        except BaseException as exc:
            if not self._ready.done():
                self._ready.set_exception(exc)
            raise

    async def client(self) -> Client:
        return await asyncio.wait_for(asyncio.shield(self._ready), 60)

    async def close(self) -> None:
        self._stop.set()
        await self._task


@pytest.fixture(scope="module", params=["stdio", "http"])
async def mcp(request: pytest.FixtureRequest, gateway: GatewayProcess) -> AsyncIterator[Client]:
    held = Held(connect(request.param, gateway))
    yield await held.client()
    await held.close()


def texts(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


def images(result: CallToolResult) -> list[ImageContent]:
    return [block for block in result.content if isinstance(block, ImageContent)]


async def run(client: Client, code: str, **arguments: Any) -> CallToolResult:
    return await client.call_tool("execute_python", {"code": code, **arguments})


async def sessions_of(gateway: GatewayProcess, tenant: str = "alpha") -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=gateway.url, headers=gateway.headers(tenant)) as http:
        sessions: list[dict[str, Any]] = (await http.get("/v1/sessions")).json()
    return sessions


# -- tools over both transports ---------------------------------------------------------------


async def test_list_tools_describes_persistence_and_limits(mcp: Client) -> None:
    tools = {tool.name: tool for tool in (await mcp.list_tools()).tools}

    assert list(tools) == TOOLS
    execute = tools["execute_python"]
    assert execute.input_schema["required"] == ["code"]
    assert set(execute.input_schema["properties"]) == {"code", "timeout_s"}
    assert execute.description is not None
    for phrase in ("persist", "60 s", "3600 s", "20000 characters", "saved to a file",
                   "no network", "input()", "df.head()"):
        assert phrase in execute.description
    assert tools["read_file"].annotations is not None
    assert tools["read_file"].annotations.read_only_hint is True


async def test_execute_code_names_the_languages_of_the_sandbox(mcp: Client) -> None:
    tools = {tool.name: tool for tool in (await mcp.list_tools()).tools}
    code = tools["execute_code"]
    assert code.input_schema["required"] == ["code", "language"]
    assert code.description is not None
    assert "own persistent session" in code.description and "60 s" in code.description
    # Both transports ask the gateway (stdio: its kernelspecs as the process starts).
    offered = code.description.split("This sandbox offers: ")[1].split(". No other")[0]
    assert offered.startswith("'python'")
    for language in ("bash", "r", "javascript", "typescript", "java"):  # the default image's
        assert f"'{language}'" in offered, language


async def test_execute_code_runs_bash_with_its_own_state(mcp: Client) -> None:
    first = await mcp.call_tool("execute_code", {"code": "word=sandboxed; cd /tmp",
                                                 "language": "bash"})
    second = await mcp.call_tool("execute_code", {"code": 'echo "$word in $(pwd)"',
                                                  "language": "Bash"})
    python = await run(mcp, "print(globals().get('word'))")
    failed = await mcp.call_tool("execute_code", {"code": "false", "language": "bash"})

    assert not first.is_error and not second.is_error, texts(second)
    assert texts(second).startswith("sandboxed in /tmp\n")
    assert texts(python).startswith("None\n")  # bash's variables are not Python's
    assert failed.is_error and "[status: error]" in texts(failed)


async def test_execute_code_in_a_missing_language_names_those_offered(mcp: Client) -> None:
    result = await mcp.call_tool("execute_code", {"code": "1", "language": "cobol"})

    assert result.is_error
    assert "The code was not run" in texts(result)
    assert "cobol" in texts(result) and "python, bash" in texts(result)


async def test_execute_python_keeps_state_across_calls(mcp: Client) -> None:
    first = await run(mcp, "import statistics\nstate_values = [3, 5, 10]")
    second = await run(mcp, "print(statistics.mean(state_values))\nlen(state_values)")

    assert not first.is_error and not second.is_error
    assert texts(first) == "[ok: the code ran and printed nothing]"
    assert texts(second).startswith("6\n\n[result Out[")
    assert texts(second).endswith("]]\n3")


async def test_execute_python_returns_plot_as_png_image(mcp: Client) -> None:
    result = await run(mcp, "import matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4])\n"
                            "plt.title('mcp')\nplt.show()")

    assert not result.is_error
    [image] = images(result)
    assert image.mime_type == "image/png"
    assert base64.b64decode(image.data).startswith(PNG_MAGIC)


async def test_execute_python_error_returns_plain_traceback(mcp: Client) -> None:
    result = await run(mcp, "def broken():\n    return {}['missing']\nbroken()")

    text = texts(result)
    assert result.is_error
    assert "KeyError" in text and "'missing'" in text and "broken()" in text
    assert "\x1b[" not in text
    assert "[status: error]" in text


async def test_execute_python_error_shows_the_short_traceback(mcp: Client) -> None:
    pandas = await run(mcp, "import pandas as pd\npd.DataFrame({'a': [1]})['nope']")
    offline = await run(mcp, "import urllib.request\nurllib.request.urlopen('https://pypi.org')")

    text = texts(pandas)
    assert "----> 2 pd.DataFrame({'a': [1]})['nope']" in text and "KeyError: 'nope'" in text
    assert "frames in library code]" in text and "site-packages" not in text
    assert "URLError" in texts(offline)
    assert "[no network] The sandbox has no network access" in texts(offline)


async def test_execute_python_timeout_marks_status(mcp: Client) -> None:
    result = await run(mcp, "import time\ntime.sleep(30)", timeout_s=1)
    after = await run(mcp, "print('alive')")

    assert result.is_error
    assert "[status: timeout]" in texts(result)
    assert texts(after) == "alive\n"


async def test_execute_python_truncates_with_file_notice(mcp: Client) -> None:
    result = await run(mcp, "for i in range(20000):\n    print(f'line {i:05d}')")

    text = texts(result)
    assert "[truncated]" in text
    assert "line 00000" in text and "line 19999" in text and "line 10000" not in text
    spill = text.split("full text in ", 1)[1].split("]", 1)[0]
    full = await mcp.call_tool("execute_python", {
        "code": f"print(open({spill!r}).read().count('line '))"})
    assert texts(full) == "20000\n"


async def test_upload_read_list_files_round_trip(mcp: Client) -> None:
    blob = bytes(range(256))
    uploaded = await mcp.call_tool("upload_file", {"path": "mcp/in.csv", "content": "a,b\n1,2\n"})
    await mcp.call_tool("upload_file", {"path": "mcp/blob.bin", "base64": True,
                                        "content": base64.b64encode(blob).decode()})
    computed = await run(mcp, "import pandas as pd\nprint(pd.read_csv('mcp/in.csv').b.sum())")

    text = await mcp.call_tool("read_file", {"path": "mcp/in.csv"})
    binary = await mcp.call_tool("read_file", {"path": "mcp/blob.bin"})
    listing = await mcp.call_tool("list_files", {})
    missing = await mcp.call_tool("read_file", {"path": "mcp/none.txt"})

    assert "Wrote 8 bytes to mcp/in.csv" in texts(uploaded)
    assert texts(computed) == "2\n"
    assert texts(text) == "a,b\n1,2\n"
    assert base64.b64decode(texts(binary).split("base64:\n", 1)[1]) == blob
    assert "mcp/in.csv\t8 bytes" in texts(listing)
    assert "mcp/blob.bin\t256 bytes" in texts(listing)
    assert missing.is_error and "list_files" in texts(missing)


async def test_read_file_returns_png_as_image(mcp: Client) -> None:
    await run(mcp, "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.savefig('chart.png')\n"
                   "plt.close()")

    result = await mcp.call_tool("read_file", {"path": "chart.png"})

    [image] = images(result)
    assert base64.b64decode(image.data).startswith(PNG_MAGIC)


async def test_restart_kernel_forgets_variables_keeps_files(mcp: Client) -> None:
    await run(mcp, "restart_var = 1\nopen('restart_kept.txt', 'w').write('kept')")

    restarted = await mcp.call_tool("restart_kernel", {})
    gone = await run(mcp, "restart_var")
    kept = await mcp.call_tool("read_file", {"path": "restart_kept.txt"})

    assert "variables" in texts(restarted) and not restarted.is_error
    assert gone.is_error and "NameError" in texts(gone)
    assert texts(kept) == "kept"


async def test_export_notebook_holds_history(mcp: Client) -> None:
    await run(mcp, "print('exported cell')")

    returned = await mcp.call_tool("export_notebook", {})
    saved = await mcp.call_tool("export_notebook", {"path": "session.ipynb"})
    reread = await run(mcp, "import json\n"
                            "print(json.load(open('session.ipynb'))['cells'][-1]['source'])")

    notebook = json.loads(texts(returned).split("\n", 1)[1])
    assert notebook["nbformat"] == 4
    sources = ["".join(cell["source"]) for cell in notebook["cells"]]
    assert sources[-1] == "print('exported cell')"
    assert "Saved the session as a notebook" in texts(saved) and "session.ipynb" in texts(saved)
    assert texts(reread) == "print('exported cell')\n"


# -- a connection's lifetime ------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_connection_end_deletes_its_session(transport: str,
                                                  gateway: GatewayProcess) -> None:
    before = {s["id"] for s in await sessions_of(gateway)}
    async with connect(transport, gateway) as client:
        await run(client, "x = 1")
        during = {s["id"] for s in await sessions_of(gateway)} - before
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        after = {s["id"] for s in await sessions_of(gateway)}
        if not during & after:
            break
        await asyncio.sleep(0.2)

    assert len(during) == 1
    assert not during & after


async def test_connection_creates_session_lazily_for_key_tenant(gateway: GatewayProcess) -> None:
    before = {s["id"] for s in await sessions_of(gateway, "beta")}
    async with connect("http", gateway, tenant="beta") as client:
        await client.list_tools()
        idle = {s["id"] for s in await sessions_of(gateway, "beta")} - before
        await run(client, "1")
        used = [s for s in await sessions_of(gateway, "beta") if s["id"] not in before]

    assert idle == set()
    assert [s["tenant"] for s in used] == ["beta"]
    assert used[0]["metadata"] == {"client": "mcp"}


# -- HTTP only: auth, tenants, protocol era ---------------------------------------------------


@pytest.mark.parametrize("authorization", [None, "Bearer rg_wrong", "Basic YTpi"])
async def test_mcp_without_valid_key_answers_401(gateway: GatewayProcess,
                                                 authorization: str | None) -> None:
    headers = dict(MCP_HEADERS)
    if authorization:
        headers["Authorization"] = authorization
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        answer = await http.post("/mcp", json=INITIALIZE, headers=headers)

    assert answer.status_code == 401
    assert answer.headers["www-authenticate"] == "Bearer"
    assert "API key" in answer.json()["detail"]


async def test_mcp_session_of_other_tenant_is_not_found(gateway: GatewayProcess) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        opened = await http.post("/mcp", json=INITIALIZE,
                                 headers={**MCP_HEADERS, **gateway.headers("alpha")})
        session_id = opened.headers["mcp-session-id"]
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        headers = {**MCP_HEADERS, "Mcp-Session-Id": session_id,
                   "MCP-Protocol-Version": "2025-11-25"}
        theirs = await http.post("/mcp", json=listing, headers={**headers,
                                                                **gateway.headers("beta")})
        ours = await http.post("/mcp", json=listing, headers={**headers,
                                                              **gateway.headers("alpha")})
        await http.delete("/mcp", headers={**headers, **gateway.headers("alpha")})

    assert opened.status_code == 200
    assert theirs.status_code == 404
    assert ours.status_code == 200 and "execute_python" in ours.text


async def test_mcp_stateless_protocol_is_refused_with_session_versions(
        gateway: GatewayProcess) -> None:
    request = {"jsonrpc": "2.0", "id": 7, "method": "server/discover", "params": {}}
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        answer = await http.post("/mcp", json=request, headers={
            **MCP_HEADERS, **gateway.headers(), "MCP-Protocol-Version": "2026-07-28"})

    error = answer.json()
    assert answer.status_code == 400
    assert error["id"] == 7
    assert error["error"]["code"] == -32022
    assert "2025-11-25" in error["error"]["data"]["supported"]


async def test_mcp_client_negotiates_session_protocol(gateway: GatewayProcess) -> None:
    async with connect("http", gateway) as client:
        version = client.protocol_version

    assert version == "2025-11-25"


# -- stdio only -------------------------------------------------------------------------------


async def test_stdio_without_key_exits_with_message(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        str(REPLGATE), "mcp", stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "REPLGATE_STATE_DIR": str(tmp_path)})
    stdout, stderr = await asyncio.wait_for(process.communicate(), 30)

    assert process.returncode == 2
    assert stdout == b""
    assert b"REPLGATE_API_KEY" in stderr


def test_import_mcp_without_server_modules() -> None:
    heavy = ["docker", "zmq", "fastapi", "aiosqlite", "nbformat", "gateway.service",
             "gateway.app"]
    probe = f"import sys, gateway.mcp; print([m for m in {heavy!r} if m in sys.modules])"

    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           check=True).stdout.strip()

    assert found == "[]"


async def test_run_shell_sees_files_of_the_session_and_its_exit_code(mcp: Client) -> None:
    await run(mcp, "open('shell_seen.txt', 'w').write('one\\ntwo\\n')")
    result = await mcp.call_tool("run_shell", {"cmd": "wc -l < shell_seen.txt; exit 4"})
    assert not result.is_error
    assert "2" in texts(result) and "[exit code 4]" in texts(result)


async def test_execute_python_traceback_is_plain_text(mcp: Client) -> None:
    result = await run(mcp, "def f():\n    raise KeyError('missing')\nf()")
    assert result.is_error
    assert "KeyError" in texts(result) and "\x1b" not in texts(result)


async def test_fork_session_returns_new_session_ids(mcp: Client, gateway: GatewayProcess) -> None:
    await run(mcp, "forked_var = 'from the parent'")

    forked = await mcp.call_tool("fork_session", {"count": 2})

    assert not forked.is_error, texts(forked)
    ids = texts(forked).split(":\n", 1)[1].split("\n")
    assert len(ids) == 2
    async with httpx.AsyncClient(base_url=gateway.url, headers=gateway.headers("alpha"),
                                 timeout=120) as http:
        for sid in ids:
            answer = await http.post(f"/v1/sessions/{sid}/execute", json={"code": "forked_var"})
            assert answer.json()["outputs"][0]["data"]["text/plain"] == "'from the parent'"
            assert (await http.delete(f"/v1/sessions/{sid}")).status_code == 204


async def test_network_policy_shows_the_sessions_network(mcp: Client) -> None:
    shown = await mcp.call_tool("network_policy", {})

    assert not shown.is_error, texts(shown)
    assert texts(shown).startswith("This session has no network: every connection is refused")
