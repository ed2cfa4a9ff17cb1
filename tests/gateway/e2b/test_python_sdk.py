"""E2B's Python SDKs (``e2b-code-interpreter``, ``e2b``), unmodified, against a real gateway.

Nothing but the three environment variables points them at replgate (``e2b_env``).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import docker
import httpx
import pytest
from e2b import (
    AuthenticationException,
    CommandExitException,
    NotFoundException,
    SandboxException,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)
from e2b_code_interpreter import AsyncSandbox, Sandbox
from e2b_code_interpreter.charts import ChartType, LineChart

from tests.conftest import GatewayProcess, running_gateway

pytestmark = pytest.mark.usefixtures("e2b_env")


@pytest.fixture(scope="module")
def sandbox(e2b_env: dict[str, str]) -> Iterator[Sandbox]:
    sandbox = Sandbox.create()
    yield sandbox
    sandbox.kill()


def test_create_is_a_replgate_session_of_the_keys_tenant(sandbox: Sandbox,
                                                         gateway: GatewayProcess) -> None:
    answer = httpx.get(f"{gateway.url}/v1/sessions/{sandbox.sandbox_id}",
                       headers=gateway.headers("alpha"))
    assert answer.status_code == 200
    assert answer.json()["tenant"] == "alpha"
    other = httpx.get(f"{gateway.url}/v1/sessions/{sandbox.sandbox_id}",
                      headers=gateway.headers("beta"))
    assert other.status_code == 404


def test_list_and_get_info_show_the_sandbox(sandbox: Sandbox) -> None:
    listed = Sandbox.list().next_items()
    assert sandbox.sandbox_id in [s.sandbox_id for s in listed]
    info = sandbox.get_info()
    assert info.sandbox_id == sandbox.sandbox_id
    assert info.state.value == "running"
    assert sandbox.is_running()


def test_run_code_keeps_state_between_calls(sandbox: Sandbox) -> None:
    sandbox.run_code("counter = 41")
    execution = sandbox.run_code("counter + 1")
    assert execution.text == "42"
    assert execution.error is None
    assert execution.execution_count is not None


def test_run_code_streams_stdout_and_stderr_to_callbacks(sandbox: Sandbox) -> None:
    out: list[str] = []
    err: list[str] = []
    execution = sandbox.run_code(
        "import sys\nprint('hello')\nprint('oops', file=sys.stderr)",
        on_stdout=lambda m: out.append(m.line), on_stderr=lambda m: err.append(m.line))
    assert "".join(out) == "hello\n"
    assert "".join(err) == "oops\n"
    assert execution.logs.stdout == out
    assert execution.logs.stderr == err


def test_run_code_reports_errors_as_data(sandbox: Sandbox) -> None:
    errors = []
    execution = sandbox.run_code("1 / 0", on_error=errors.append)
    assert execution.error is not None
    assert execution.error.name == "ZeroDivisionError"
    assert "division by zero" in execution.error.value
    assert "ZeroDivisionError" in execution.error.traceback
    assert errors == [execution.error]


def test_run_code_returns_a_png_chart_with_its_data(sandbox: Sandbox) -> None:
    execution = sandbox.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [4, 1, 9], label='y')\nplt.title('rise')\nplt.show()")
    charts = [r for r in execution.results if r.png]
    assert charts and len(charts[0].png) > 1000
    chart = charts[0].chart
    assert isinstance(chart, LineChart)
    assert chart.type == ChartType.LINE
    assert chart.title == "rise"
    assert [[float(v) for v in point] for point in chart.elements[0].points] == [
        [1, 4], [2, 1], [3, 9]]


def test_run_code_returns_a_dataframes_html(sandbox: Sandbox) -> None:
    execution = sandbox.run_code(
        "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
    main = [r for r in execution.results if r.is_main_result]
    assert len(main) == 1
    assert main[0].html is not None and "<table" in main[0].html
    assert main[0].text is not None and "a" in main[0].text


def test_run_code_timeout_stops_the_cell_and_keeps_state(sandbox: Sandbox) -> None:
    sandbox.run_code("kept = 'still here'")
    with pytest.raises(TimeoutException):
        sandbox.run_code("import time\nwhile True: time.sleep(0.1)", timeout=2)
    started = time.monotonic()
    execution = sandbox.run_code("kept", timeout=30)
    assert execution.text == "still here"
    assert time.monotonic() - started < 25  # the stuck cell was stopped, not waited for


def test_run_code_env_vars_apply_to_that_call_only(sandbox: Sandbox) -> None:
    execution = sandbox.run_code("import os\nos.environ.get('E2B_ONLY_HERE')",
                                 envs={"E2B_ONLY_HERE": "yes"})
    assert execution.text == "yes"
    assert sandbox.run_code("'E2B_ONLY_HERE' in os.environ").text == "False"


def test_commands_run_returns_output_and_exit_code(sandbox: Sandbox) -> None:
    result = sandbox.commands.run("echo out; echo err >&2")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "out\n", "err\n")
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("echo partial; exit 3")
    assert failed.value.exit_code == 3
    assert failed.value.stdout == "partial\n"


def test_commands_run_streams_to_callbacks_with_envs_and_cwd(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("/home/user/cmd_dir")
    out: list[str] = []
    err: list[str] = []
    result = sandbox.commands.run(
        "pwd; echo \"$GREETING\"; echo warn >&2; [[ -d . ]] && echo bash",
        envs={"GREETING": "hello"}, cwd="/home/user/cmd_dir",
        on_stdout=out.append, on_stderr=err.append)
    assert "".join(out) == result.stdout
    assert result.stdout.splitlines()[1:] == ["hello", "bash"]
    assert result.stdout.splitlines()[0].endswith("/cmd_dir")
    assert "".join(err) == "warn\n"


def test_commands_run_timeout_raises_and_stops_it(sandbox: Sandbox) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 30", timeout=1)
    while sandbox.commands.list() and time.monotonic() - started < 20:
        time.sleep(0.1)  # stopped at its timeout on the gateway's side too
    assert sandbox.commands.list() == []


def test_background_command_waits_and_kills(sandbox: Sandbox) -> None:
    quick = sandbox.commands.run("sleep 0.5; echo done", background=True)
    assert quick.wait().stdout == "done\n"
    slow = sandbox.commands.run("echo started; sleep 60", background=True)
    assert slow.pid in [p.pid for p in sandbox.commands.list()]
    assert slow.kill()
    with pytest.raises(CommandExitException):
        slow.wait()
    assert sandbox.commands.list() == []
    assert not sandbox.commands.kill(slow.pid)


def test_commands_connect_follows_a_running_command(sandbox: Sandbox) -> None:
    started = sandbox.commands.run("sleep 1; echo later", background=True)
    started.disconnect()
    again = sandbox.commands.connect(started.pid)
    assert again.wait().stdout == "later\n"


def test_files_write_read_list_remove(sandbox: Sandbox) -> None:
    sandbox.files.write("data.csv", "a,b\n1,2\n")
    sandbox.files.write("/home/user/nested/blob.bin", b"\x00\x01\xff")
    assert sandbox.files.read("/home/user/data.csv") == "a,b\n1,2\n"
    assert bytes(sandbox.files.read("nested/blob.bin", format="bytes")) == b"\x00\x01\xff"
    names = {entry.name for entry in sandbox.files.list("/home/user")}
    assert {"data.csv", "nested"} <= names
    # the code sees the same files, by relative and absolute name
    execution = sandbox.run_code(
        "import pandas as pd\n"
        "(len(pd.read_csv('data.csv')), open('/home/user/data.csv').read().count(','))")
    assert execution.text == "(1, 2)"
    assert sandbox.files.exists("nested/blob.bin")
    sandbox.files.remove("nested")
    assert not sandbox.files.exists("nested/blob.bin")
    with pytest.raises(NotFoundException):
        sandbox.files.read("nested/blob.bin")


def test_files_make_dir_rename_and_info(sandbox: Sandbox) -> None:
    assert sandbox.files.make_dir("/home/user/reports/2026")
    assert not sandbox.files.make_dir("reports/2026")
    sandbox.files.write("reports/draft.txt", "x")
    moved = sandbox.files.rename("reports/draft.txt", "reports/2026/final.txt")
    assert moved.path == "/home/user/reports/2026/final.txt"
    info = sandbox.files.get_info("reports/2026/final.txt")
    assert info.size == 1
    deep = sandbox.files.list("reports", depth=2)
    assert "/home/user/reports/2026/final.txt" in [e.path for e in deep]


def test_absolute_paths_elsewhere_are_the_sandboxs_relative_ones_stay_in_home_user(
        sandbox: Sandbox) -> None:
    assert "sandbox:x:1000:1000" in sandbox.files.read("/etc/passwd")
    with pytest.raises(SandboxException, match="/home/user"):
        sandbox.files.write("../escape.txt", "x")


def test_restart_code_context_drops_variables_keeps_files(sandbox: Sandbox) -> None:
    sandbox.run_code("gone_after_restart = 1")
    sandbox.files.write("kept.txt", "k")
    context = sandbox.list_code_contexts()[0]  # the Python one (each language's follows)
    sandbox.restart_code_context(context)
    execution = sandbox.run_code("'gone_after_restart' in dir(), open('kept.txt').read()")
    assert execution.text == "(False, 'k')"


def test_run_code_in_another_language_keeps_its_own_state(e2b_env: dict[str, str]) -> None:
    # Its own sandbox: the one above counts its contexts.
    sandbox = Sandbox.create()
    try:
        assert sandbox.run_code("n=41", language="bash").error is None
        counted = sandbox.run_code("echo $((n + 1))", language="bash")
        assert counted.logs.stdout == ["42\n"]
        python = sandbox.run_code("n = 'py'; n")
        assert python.text == "py"
        contexts = {c.language: c for c in sandbox.list_code_contexts()}
        assert contexts["python"].id == sandbox.sandbox_id and "bash" in contexts
        with pytest.raises(SandboxException, match="python, bash, r, javascript, java"):
            sandbox.run_code("1", language="cobol")
    finally:
        sandbox.kill()


def test_code_contexts_are_made_restarted_and_removed(e2b_env: dict[str, str]) -> None:
    sandbox = Sandbox.create()
    try:
        context = sandbox.create_code_context(language="bash")
        assert (context.language, context.cwd) == ("bash", "/home/user")
        sandbox.run_code("k=7", context=context)
        assert sandbox.run_code("echo ${k:-unset}", context=context).logs.stdout == ["7\n"]
        sandbox.restart_code_context(context)
        after = sandbox.run_code("echo ${k:-unset}", context=context)
        assert after.logs.stdout == ["unset\n"]
        sandbox.remove_code_context(context)
        assert context.id not in [c.id for c in sandbox.list_code_contexts()]
        with pytest.raises(SandboxException, match="Python context"):
            sandbox.remove_code_context(sandbox.sandbox_id)
    finally:
        sandbox.kill()


def test_connect_by_id_reaches_the_same_state(sandbox: Sandbox) -> None:
    sandbox.run_code("shared = 'across connections'")
    again = Sandbox.connect(sandbox.sandbox_id)
    assert again.run_code("shared").text == "across connections"


def test_unknown_template_is_e2bs_404_with_a_sentence() -> None:
    with pytest.raises(SandboxException, match="template 'no-such-template' not found"):
        Sandbox.create(template="no-such-template")


def test_asking_for_the_internet_gets_the_profiles_network_and_says_so() -> None:
    """Older SDKs send ``allow_internet_access: true`` on every create: never a failure; the
    sandbox gets its profile's network (none), and its description says what it got."""
    with Sandbox.create(allow_internet_access=True,
                        network={"allow_public_traffic": True}) as sandbox:
        info = sandbox.get_info()
        assert info.allow_internet_access is False
        assert info.network == {"allow_out": [], "deny_out": ["0.0.0.0/0"],
                                "allow_public_traffic": False}
        assert info.lifecycle == {"on_timeout": "kill", "auto_resume": False}
        assert sandbox.commands.run("echo ok").stdout == "ok\n"


def test_private_traffic_is_what_every_sandbox_has(gateway: GatewayProcess) -> None:
    with Sandbox.create(network={"allow_public_traffic": False}) as sandbox:
        assert sandbox.run_code("1 + 1").text == "2"
        untokened = httpx.post(f"{gateway.url}/e2b/sandbox/execute", json={"code": "1"},
                               headers={"E2b-Sandbox-Id": sandbox.sandbox_id,
                                        "E2b-Sandbox-Port": "49999"})
        assert untokened.status_code == 401


def test_network_wider_than_the_profile_is_refused_with_a_sentence() -> None:
    with pytest.raises(SandboxException, match=r"allow entry '1.1.1.1' is beyond what this "
                                               r"profile allows"):
        Sandbox.create(network={"allow_out": ["1.1.1.1"], "deny_out": ["0.0.0.0/0"]})


def test_wrong_api_key_is_refused(e2b_env: dict[str, str]) -> None:
    with pytest.raises(AuthenticationException, match="replgate API key"):
        Sandbox.create(api_key="rg_not_a_key")


def test_other_tenant_cannot_connect(sandbox: Sandbox, gateway: GatewayProcess) -> None:
    with pytest.raises(SandboxException):
        Sandbox.connect(sandbox.sandbox_id, api_key=gateway.keys["beta"])


def test_set_timeout_ends_the_sandbox() -> None:
    sandbox = Sandbox.create(timeout=60)
    sandbox.set_timeout(2)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and sandbox.is_running():
        time.sleep(0.5)
    assert not sandbox.is_running()
    assert sandbox.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()]


def test_kill_deletes_the_session(gateway: GatewayProcess) -> None:
    sandbox = Sandbox.create()
    sandbox.kill()
    assert not sandbox.is_running()
    answer = httpx.get(f"{gateway.url}/v1/sessions/{sandbox.sandbox_id}",
                       headers=gateway.headers("alpha"))
    assert answer.status_code == 404
    assert Sandbox.kill(sandbox.sandbox_id) is False  # already gone: E2B's answer


async def test_async_sandbox_runs_code_with_async_callbacks_and_files() -> None:
    sandbox = await AsyncSandbox.create()
    try:
        seen: list[str] = []

        async def collect(message: object) -> None:
            seen.append(str(message))

        execution = await sandbox.run_code("for i in range(3): print(i)", on_stdout=collect)
        assert "".join(seen) == "0\n1\n2\n"
        assert execution.logs.stdout
        await sandbox.files.write("async.txt", "from async")
        assert await sandbox.files.read("async.txt") == "from async"
        result = await sandbox.run_code("open('async.txt').read()")
        assert result.text == "from async"
    finally:
        await sandbox.kill()


def test_run_code_is_in_the_sessions_history_and_notebook(sandbox: Sandbox,
                                                          gateway: GatewayProcess) -> None:
    sandbox.run_code("recorded = 'in the notebook'")
    notebook = httpx.get(f"{gateway.url}/v1/sessions/{sandbox.sandbox_id}/notebook",
                         headers=gateway.headers("alpha")).json()
    sources = ["".join(cell["source"]) for cell in notebook["cells"]]
    assert "recorded = 'in the notebook'" in sources


def test_sandbox_survives_a_gateway_restart(docker_client: docker.DockerClient) -> None:
    with running_gateway(docker_client) as other:
        options = {"api_key": other.keys["alpha"], "api_url": f"{other.url}/e2b",
                   "sandbox_url": f"{other.url}/e2b/sandbox"}
        sandbox = Sandbox.create(**options)
        sandbox.run_code("before = 'the restart'")
        sandbox.files.write("kept.txt", "on disk")
        other.stop(signal.SIGKILL)  # a killed gateway's sessions are taken back at start
        other.start()
        # the same SDK object: its access token is still valid, the state still there
        assert sandbox.run_code("before").text == "the restart"
        assert sandbox.files.read("kept.txt") == "on disk"
        Sandbox.kill(sandbox.sandbox_id, **options)


def test_list_filters_by_metadata() -> None:
    tagged = Sandbox.create(metadata={"team": "blue & green"})
    try:
        found = Sandbox.list(query=SandboxQuery(metadata={"team": "blue & green"})).next_items()
        assert [s.sandbox_id for s in found] == [tagged.sandbox_id]
        assert found[0].metadata == {"team": "blue & green"}
        none = Sandbox.list(query=SandboxQuery(metadata={"team": "red"})).next_items()
        assert none == []
    finally:
        tagged.kill()


def _ids(query: SandboxQuery) -> list[str]:
    return [s.sandbox_id for s in Sandbox.list(query=query).next_items()]


def test_pause_then_connect_keeps_variables() -> None:
    sandbox = Sandbox.create()
    try:
        sandbox.run_code("kept = [1, 2, 3]")
        assert sandbox.beta_pause() is True
        assert Sandbox.pause(sandbox.sandbox_id) is False  # already paused: E2B's 409
        assert not sandbox.is_running()
        assert sandbox.get_info().state == SandboxState.PAUSED
        assert sandbox.sandbox_id in _ids(SandboxQuery(state=[SandboxState.PAUSED]))
        assert sandbox.sandbox_id not in _ids(SandboxQuery(state=[SandboxState.RUNNING]))
        again = Sandbox.connect(sandbox.sandbox_id)
        assert again.is_running()
        assert again.run_code("sum(kept)").text == "6"
        assert sandbox.get_info().state == SandboxState.RUNNING
    finally:
        sandbox.kill()


def test_filesystem_pause_and_reboot_keep_files_not_variables() -> None:
    sandbox = Sandbox.create()
    try:
        sandbox.files.write("kept.txt", "on disk")
        sandbox.run_code("gone = 1")
        assert sandbox.pause(mode="filesystem")
        sandbox.connect()
        check = "'gone' in dir(), open('kept.txt').read()"
        assert sandbox.run_code(check).text == "(False, 'on disk')"
        sandbox.run_code("gone = 2")
        sandbox.pause()
        sandbox.connect(on_resume="reboot")
        assert sandbox.run_code(check).text == "(False, 'on disk')"
    finally:
        sandbox.kill()


def test_list_pages_newest_first_with_next_token() -> None:
    older, newer = (Sandbox.create(metadata={"paged": "yes"}) for _ in range(2))
    try:
        pages = Sandbox.list(query=SandboxQuery(metadata={"paged": "yes"}), limit=1)
        first = pages.next_items()
        assert pages.has_next
        second = pages.next_items()
        assert not pages.has_next
        assert [s.sandbox_id for s in first + second] == [newer.sandbox_id, older.sandbox_id]
        oldest_first = Sandbox.list(query=SandboxQuery(metadata={"paged": "yes"}), order="asc")
        assert [s.sandbox_id for s in oldest_first.next_items()] == [
            older.sandbox_id, newer.sandbox_id]
    finally:
        older.kill()
        newer.kill()


def test_fork_copies_variables_files_and_metadata() -> None:
    sandbox = Sandbox.create(metadata={"origin": "parent"})
    try:
        sandbox.run_code("kept = 'in the fork'")
        sandbox.files.write("copied.txt", "on disk")
        (child,) = sandbox.fork(timeout=60)
        assert isinstance(child, Sandbox), child
        try:
            assert child.sandbox_id != sandbox.sandbox_id
            execution = child.run_code("kept, open('copied.txt').read()")
            assert execution.text == "('in the fork', 'on disk')"
            assert child.get_info().metadata == {"origin": "parent"}
        finally:
            child.kill()
        with pytest.raises(SandboxException, match="16"):
            sandbox.fork(count=20)
    finally:
        sandbox.kill()

