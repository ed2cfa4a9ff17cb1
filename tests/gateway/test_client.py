"""The Python client end to end against a real ``replgate serve``: streaming, state, images,
errors and timeouts as data, refusals as exceptions, files, notebook, restart, interrupt, the
sync face, and the function-calling tools (OpenAI and Anthropic shapes, tool-call round trips).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any
from unittest.mock import ANY

import httpx
import pytest

from gateway.client import (
    AsyncSandbox,
    DisplayEvent,
    ErrorEvent,
    Execution,
    ExecutionError,
    InvalidRequestError,
    NotFoundError,
    Output,
    Sandbox,
    StreamEvent,
    TextPart,
    ToolLimits,
    ToolResult,
    render_execution,
    tool_specs,
)
from tests.conftest import GatewayProcess

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOT = ("import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots(figsize=(2, 2))\n"
        "ax.plot([1, 2, 3], [1, 4, 9])\n"
        "plt.show()")


@pytest.fixture(scope="module")
async def sandbox(gateway: GatewayProcess) -> AsyncIterator[AsyncSandbox]:
    """One session shared by this module's tests; each test uses names of its own."""
    sbx = await AsyncSandbox.create(base_url=gateway.url, api_key=gateway.keys["alpha"])
    yield sbx
    await sbx.close()


def png_of(data: dict[str, Any]) -> bytes:
    return base64.b64decode(data["image/png"])


# -- running code -----------------------------------------------------------------------------


async def test_run_code_streams_events_to_sync_and_async_callbacks(sandbox: AsyncSandbox) -> None:
    stdout: list[tuple[float, str]] = []
    stderr: list[str] = []

    async def on_stderr(event: StreamEvent) -> None:
        await asyncio.sleep(0)
        stderr.append(event.text)

    code = ("import sys, time\nprint('first', flush=True)\nprint('oops', file=sys.stderr, "
            "flush=True)\ntime.sleep(1.0)\nprint('last')")
    execution = await sandbox.run_code(
        code, on_stdout=lambda event: stdout.append((time.monotonic(), event.text)),
        on_stderr=on_stderr)
    returned = time.monotonic()

    assert execution.status == "ok"
    assert execution.stdout == "first\nlast\n"
    assert "".join(text for _, text in stdout) == "first\nlast\n"
    assert stderr == ["oops\n"]
    assert returned - stdout[0][0] > 0.7  # "first" arrived while the code still ran


async def test_run_code_gives_callbacks_whole_lines_of_a_print_flushed_in_pieces(
        sandbox: AsyncSandbox) -> None:
    # A flush inside one print (a kernel flush timer firing between its words) sent "step" and
    # " 1\n" as two events; the quickstart notebook's live output then read "live: steplive:  1".
    code = ("import sys\nfor i in range(10):\n    sys.stdout.write('step'); sys.stdout.flush()\n"
            "    print('', i, flush=True)")
    printed: list[str] = []
    execution = await sandbox.run_code(code, on_stdout=lambda event: printed.append(event.text))
    assert execution.status == "ok"
    assert printed == [f"step {i}\n" for i in range(10)]


async def test_run_code_holds_an_unfinished_line_for_callbacks_unless_asked(
        sandbox: AsyncSandbox) -> None:
    code = "import time\nprint('working', end='', flush=True)\ntime.sleep(0.5)\nprint(' done')"
    lines: list[str] = []
    await sandbox.run_code(code, on_stdout=lambda event: lines.append(event.text))
    assert lines == ["working done\n"]
    raw: list[str] = []
    await sandbox.run_code(code, on_stdout=lambda event: raw.append(event.text),
                           whole_lines=False)
    assert raw == ["working", " done\n"]
    tail: list[str] = []
    await sandbox.run_code("print('no newline at the end', end='')",
                           on_stdout=lambda event: tail.append(event.text))
    assert tail == ["no newline at the end"]


async def test_run_code_keeps_state_between_calls(sandbox: AsyncSandbox) -> None:
    await sandbox.run_code("import math\nstate_radius = 2.0")

    execution = await sandbox.run_code("round(math.pi * state_radius ** 2, 3)")

    assert execution.status == "ok"
    assert execution.outputs[-1].type == "result"
    assert execution.outputs[-1].data["text/plain"] == "12.566"


async def test_run_code_returns_plot_as_png_display(sandbox: AsyncSandbox) -> None:
    displayed: list[DisplayEvent] = []

    execution = await sandbox.run_code(PLOT, on_display=displayed.append)

    images = [o for o in execution.outputs if "image/png" in o.data]
    assert execution.status == "ok"
    assert len(images) == 1
    assert png_of(images[0].data).startswith(PNG_MAGIC)
    assert [event.type for event in displayed] == ["display"]


async def test_run_code_error_is_data_with_callback(sandbox: AsyncSandbox) -> None:
    errors: list[ErrorEvent] = []

    execution = await sandbox.run_code("error_before = 1\n1 / 0", on_error=errors.append)
    after = await sandbox.run_code("print(error_before)")

    assert execution.status == "error"
    assert execution.error is not None and execution.error.ename == "ZeroDivisionError"
    assert [event.ename for event in errors] == ["ZeroDivisionError"]
    assert after.stdout == "1\n"


async def test_error_answers_to_e2b_names_beside_ours(sandbox: AsyncSandbox) -> None:
    from e2b_code_interpreter import ExecutionError as E2BExecutionError

    code = "def check(n):\n    raise ValueError(f'bad {n}')\ncheck(3)"
    for execution in (await sandbox.run_code(code), await sandbox.execute_http(code)):
        error = execution.error
        assert error is not None
        assert (error.name, error.value) == (error.ename, error.evalue) == ("ValueError", "bad 3")
        assert isinstance(error.traceback, str)  # E2B's one string, Jupyter's lines joined
        assert error.traceback == "\n".join(error.traceback_lines)
        assert "ValueError" in error.traceback and "\x1b[" in error.traceback
        assert json.loads(error.to_json()) == {"name": "ValueError", "value": "bad 3",
                                               "traceback": error.traceback}
        assert error.short.endswith("ValueError: bad 3") and "check(3)" in error.short
        e2b = E2BExecutionError(error.name, error.value, error.traceback)
        assert {name: getattr(error, name) for name in vars(e2b)} == vars(e2b)
        assert json.loads(error.to_json()) == json.loads(e2b.to_json())
        # the wire keeps Jupyter's list under its own name
        assert error.model_dump()["traceback"] == error.traceback_lines


async def test_run_code_timeout_is_data_and_session_survives(sandbox: AsyncSandbox) -> None:
    execution = await sandbox.run_code("import time\ntime.sleep(30)", timeout=1)
    after = await sandbox.run_code("print('still here')")

    assert execution.status == "timeout"
    assert after.status == "ok" and after.stdout == "still here\n"


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("limit", "status_code"), [(1e9, 400), (-1, 422)])
async def test_run_code_refused_timeout_raises_invalid_request(
        sandbox: AsyncSandbox, limit: float, status_code: int) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        await sandbox.run_code("print('never')", timeout=limit)
    after = await sandbox.run_code("print('next')")

    assert caught.value.status_code == status_code
    assert "timeout_s" in caught.value.message
    assert after.stdout == "next\n"


async def test_interrupt_stops_running_code(sandbox: AsyncSandbox) -> None:
    started = asyncio.Event()
    running = asyncio.create_task(sandbox.run_code(
        "import time\nprint('started', flush=True)\nfor _ in range(300):\n    time.sleep(0.1)",
        on_stdout=lambda event: started.set()))
    await asyncio.wait_for(started.wait(), 10)

    interrupted = await sandbox.interrupt()
    execution = await asyncio.wait_for(running, 10)

    assert interrupted is True
    assert execution.status == "interrupted"
    assert await sandbox.interrupt() is False


# -- files, notebook, restart -----------------------------------------------------------------


async def test_files_round_trip_text_and_binary(sandbox: AsyncSandbox) -> None:
    blob = bytes(range(256))
    await sandbox.files.write("files_test/in.csv", "a,b\n1,2\n")
    await sandbox.files.write("files_test/blob.bin", blob)
    execution = await sandbox.run_code(
        "import pandas as pd\nprint(pd.read_csv('files_test/in.csv').b.sum())\n"
        "open('files_test/out.txt', 'w').write('from the kernel')")

    listed = {info.path: info.size for info in await sandbox.files.list()}

    assert execution.stdout == "2\n"
    assert await sandbox.files.read("files_test/blob.bin") == blob
    assert await sandbox.files.read("files_test/out.txt") == b"from the kernel"
    assert listed["files_test/in.csv"] == 8 and listed["files_test/blob.bin"] == 256
    with pytest.raises(NotFoundError):
        await sandbox.files.read("files_test/missing.txt")
    with pytest.raises(InvalidRequestError):
        await sandbox.files.write("../escape.txt", "no")


async def test_notebook_holds_executions_in_order(sandbox: AsyncSandbox) -> None:
    await sandbox.run_code("notebook_marker = 'nb-1'\nprint(notebook_marker)")
    await sandbox.run_code("print(notebook_marker + '-2')")

    notebook = await sandbox.notebook()

    sources = ["".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
               for cell in notebook["cells"]]
    first = sources.index("notebook_marker = 'nb-1'\nprint(notebook_marker)")
    assert sources[first + 1] == "print(notebook_marker + '-2')"
    assert notebook["nbformat"] == 4
    assert notebook["cells"][first + 1]["outputs"][0]["text"] == "nb-1-2\n"


async def test_restart_forgets_variables_keeps_files(sandbox: AsyncSandbox) -> None:
    await sandbox.run_code("restart_var = 1\nopen('restart_kept.txt', 'w').write('kept')")

    info = await sandbox.restart()
    execution = await sandbox.run_code("restart_var")

    assert info.execution_count == 0
    assert execution.status == "error"
    assert execution.error is not None and execution.error.ename == "NameError"
    assert await sandbox.files.read("restart_kept.txt") == b"kept"


async def test_pause_resume_and_fork_keep_variables(sandbox: AsyncSandbox,
                                                    gateway: GatewayProcess) -> None:
    await sandbox.run_code("pause_var = [1, 2]")

    paused = await sandbox.pause()
    resumed = await sandbox.resume()
    forks = await sandbox.fork(1, metadata={"role": "copy"})
    copy = await AsyncSandbox.connect(forks[0].id, base_url=gateway.url,
                                      api_key=gateway.keys["alpha"])
    try:
        in_copy = await copy.run_code("pause_var")
    finally:
        await copy.close()

    assert paused.status == "paused" and paused.paused_with == "variables"
    assert resumed.status == "idle"
    assert in_copy.outputs[0].data["text/plain"] == "[1, 2]"


# -- lifetime and the sync face ---------------------------------------------------------------


async def test_context_manager_deletes_session(gateway: GatewayProcess) -> None:
    async with await AsyncSandbox.create(base_url=gateway.url,
                                         api_key=gateway.keys["alpha"]) as sbx:
        session_id = sbx.session_id
        assert (await sbx.run_code("print(1)")).stdout == "1\n"

    async with httpx.AsyncClient(base_url=gateway.url, headers=gateway.headers()) as http:
        answer = await http.get(f"/v1/sessions/{session_id}")
    assert answer.status_code == 404


def test_sync_sandbox_runs_code_files_and_tools(gateway: GatewayProcess) -> None:
    with Sandbox.create(base_url=gateway.url, api_key=gateway.keys["alpha"]) as sbx:
        printed: list[str] = []
        sbx.run_code("sync_x = 20")
        execution = sbx.run_code("print(sync_x + 1)", on_stdout=lambda e: printed.append(e.text))
        sbx.files.write("sync.txt", "hello")
        result = sbx.tools.call("read_file", {"path": "sync.txt"})
        session_id = sbx.session_id

    assert execution.stdout == "21\n" and printed == ["21\n"]
    assert isinstance(result, ToolResult) and result.text == "hello"
    assert httpx.get(f"{gateway.url}/v1/sessions/{session_id}",
                     headers=gateway.headers()).status_code == 404


# -- function calling -------------------------------------------------------------------------


def test_tools_define_openai_and_anthropic_shapes(sandbox: AsyncSandbox) -> None:
    openai = sandbox.tools.openai()
    anthropic = sandbox.tools.anthropic()

    names = ["execute_python", "execute_code", "upload_file", "read_file", "list_files",
             "restart_kernel", "export_notebook", "run_shell", "fork_session",
             "network_policy"]
    assert [tool["function"]["name"] for tool in openai] == names
    assert [tool["name"] for tool in anthropic] == names
    execute = openai[0]
    assert execute["type"] == "function"
    assert execute["function"]["parameters"] == anthropic[0]["input_schema"]
    assert execute["function"]["parameters"] == {
        "type": "object", "additionalProperties": False, "required": ["code"],
        "properties": {
            "code": {"type": "string", "description": ANY},
            "timeout_s": {"type": "number", "exclusiveMinimum": 0, "description": ANY}}}
    description = anthropic[0]["description"]
    for phrase in ("persist", "60 s", "20000 characters", "no network", "input()", "df.head()"):
        assert phrase in description
    assert [t["name"] for t in sandbox.tools.anthropic(["execute_python"])] == ["execute_python"]


async def test_run_code_in_another_language_over_both_paths(sandbox: AsyncSandbox) -> None:
    streamed = await sandbox.run_code("greeting=hi; echo $greeting", language="bash")
    plain = await sandbox.execute_http("echo ${greeting}-again", language="bash")
    tool = await sandbox.tools.call("execute_code", {"code": "echo $greeting", "language": "bash"})

    assert (streamed.status, streamed.stdout, streamed.language) == ("ok", "hi\n", "bash")
    assert (plain.stdout, plain.language) == ("hi-again\n", "bash")
    assert not tool.is_error and tool.text.startswith("hi\n")


async def test_tool_call_anthropic_round_trip_returns_text_and_image(
        sandbox: AsyncSandbox) -> None:
    content = [
        {"type": "text", "text": "Let me plot it."},
        {"type": "tool_use", "id": "toolu_1", "name": "execute_python",
         "input": {"code": "print('plotting')\n" + PLOT}},
        SimpleNamespace(type="tool_use", id="toolu_2", name="execute_python",
                        input={"code": "1 / 0"}),
    ]

    results = await sandbox.tools.anthropic_results(content)

    assert [r["tool_use_id"] for r in results] == ["toolu_1", "toolu_2"]
    plot, error = results
    assert plot["type"] == "tool_result" and "is_error" not in plot
    assert plot["content"][0] == {"type": "text", "text": "plotting\n"}
    image = next(block for block in plot["content"] if block["type"] == "image")
    assert image["source"]["type"] == "base64"
    assert image["source"]["media_type"] == "image/png"
    assert base64.b64decode(image["source"]["data"]).startswith(PNG_MAGIC)
    assert error["is_error"] is True
    text = "\n".join(block["text"] for block in error["content"])
    assert "ZeroDivisionError" in text and "\x1b[" not in text
    assert "[status: error]" in text


async def test_tool_call_openai_round_trip_parses_json_arguments(
        sandbox: AsyncSandbox) -> None:
    # The session is the module's: this file makes the listing's content known, whichever
    # tests ran before (alone, this test would find an empty working directory).
    await sandbox.files.write("openai_tools/listed.txt", "listed")
    tool_calls = [
        SimpleNamespace(id="call_1", type="function", function=SimpleNamespace(
            name="execute_python", arguments=json.dumps({"code": PLOT}))),
        {"id": "call_2", "type": "function", "function": {
            "name": "list_files", "arguments": "{}"}},
    ]

    messages = await sandbox.tools.openai_messages(tool_calls)

    assert [m["role"] for m in messages] == ["tool", "user", "tool"]
    assert messages[0]["tool_call_id"] == "call_1"
    assert "1 image(s) attached" in messages[0]["content"]
    image = messages[1]["content"][1]
    assert image["type"] == "image_url"
    assert image["image_url"]["url"].startswith("data:image/png;base64,iVBOR")
    assert messages[2]["tool_call_id"] == "call_2"
    assert "file(s) in the working directory" in messages[2]["content"]
    assert "openai_tools/listed.txt\t6 bytes" in messages[2]["content"].splitlines()


async def test_tool_call_with_bad_arguments_returns_error_result(sandbox: AsyncSandbox) -> None:
    not_json = await sandbox.tools.call("execute_python", "{not json")
    wrong_type = await sandbox.tools.call("execute_python", {"code": 1})
    unknown = await sandbox.tools.call("rm_rf", {})
    too_long = await sandbox.tools.call("execute_python", {"code": "1", "timeout_s": 1e9})
    missing = await sandbox.tools.call("read_file", {"path": "nope/missing.txt"})

    assert all(r.is_error for r in (not_json, wrong_type, unknown, too_long, missing))
    assert "not a JSON object" in not_json.text
    assert "code" in wrong_type.text
    assert "execute_python" in unknown.text
    assert "timeout_s" in too_long.text
    assert "list_files" in missing.text


async def test_tool_call_timeout_marks_status(sandbox: AsyncSandbox) -> None:
    result = await sandbox.tools.call(
        "execute_python", {"code": "import time\ntime.sleep(30)", "timeout_s": 1})

    assert result.is_error
    assert "[status: timeout]" in result.text
    assert result.execution is not None and result.execution.status == "timeout"


# -- rendering for a model (no gateway needed) ------------------------------------------------


def test_render_execution_died_says_what_was_lost() -> None:
    execution = Execution(status="died", restarted=True, reason="out of memory (2g)")

    result = render_execution(execution)

    assert result.is_error
    assert "[status: died]" in result.text and "out of memory (2g)" in result.text
    assert "variables and imports are gone, files in the working directory are kept" in (
        result.text)


def test_render_execution_denied_by_policy_is_error_with_note() -> None:
    execution = Execution(status="denied", reason="rule 'no-subprocess'",
                          error=ExecutionError(ename="PolicyDenied", evalue="subprocess"))

    result = render_execution(execution)

    assert result.is_error
    assert result.text.endswith("[status: denied] The gateway's policy refused this code "
                                "before it ran (rule 'no-subprocess'). Do it another way, or "
                                "ask the user.")


def test_render_execution_cuts_long_result_to_head_and_tail() -> None:
    long = "".join(f"{i:06d}\n" for i in range(10_000))
    execution = Execution(status="ok", execution_count=3,
                          outputs=[Output(type="result", data={"text/plain": long})])

    [part] = render_execution(execution, max_chars=1000).parts

    assert isinstance(part, TextPart)
    assert part.text.startswith("[result Out[3]]\n000000\n")
    assert part.text.endswith("009999\n")
    assert "characters cut of 70000" in part.text and len(part.text) < 1300


def test_render_execution_strips_ansi_and_keeps_order() -> None:
    execution = Execution(
        status="error", stdout="out\n", stderr="warn\n",
        outputs=[Output(type="display", data={"image/png": "iVBORw0K", "text/plain": "<Fig>"})],
        error=ExecutionError(ename="ValueError", evalue="bad",
                             traceback=["\x1b[0;31mValueError\x1b[0m: bad"]))

    result = render_execution(execution)

    assert [type(part).__name__ for part in result.parts] == [
        "TextPart", "TextPart", "ImagePart", "TextPart", "TextPart"]
    assert result.text.split("\n")[:5] == ["out", "", "[stderr]", "warn", ""]
    assert "[error]\nValueError: bad" in result.text
    assert result.to_openai("c1") == {"role": "tool", "tool_call_id": "c1", "content": (
        result.text + "\n[1 image(s) attached in the next message]")}


def test_tool_specs_state_configured_limits() -> None:
    execute = tool_specs(ToolLimits(default_timeout_s=5, max_timeout_s=30,
                                    output_chars=1234))[0]

    assert "5 s by default (timeout_s up to 30 s)" in execute.description
    assert "about 1234 characters" in execute.description
    export = next(s for s in tool_specs() if s.name == "export_notebook").anthropic()[
        "input_schema"]
    assert export["properties"]["path"]["type"] == "string"
    assert "required" not in export
