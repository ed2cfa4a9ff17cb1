"""The code interpreter as E2B's own suite measures it (``e2b-dev/code-interpreter``'s
``python/tests``): default contexts, a sandbox killed mid-run, ``Result.data`` and ``.json``,
PIL images saved and shown. E2B's SDK, unmodified, against a real gateway."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest
from e2b import TimeoutException
from e2b_code_interpreter import AsyncSandbox, Sandbox

from tests.conftest import GatewayProcess

HOME = "/home/user"


@pytest.fixture(scope="module")
def sandbox(e2b_env: dict[str, str]) -> Iterator[Sandbox]:
    sandbox = Sandbox.create()
    yield sandbox
    sandbox.kill()


@pytest.fixture
def fresh(e2b_env: dict[str, str]) -> Iterator[Sandbox]:
    """A sandbox of this test alone (its contexts listed, or killed)."""
    sandbox = Sandbox.create()
    yield sandbox
    Sandbox.kill(sandbox.sandbox_id)


# -- contexts --------------------------------------------------------------------------------


def test_a_new_sandbox_lists_a_default_context_per_language(fresh: Sandbox) -> None:
    contexts = fresh.list_code_contexts()
    languages = [c.language for c in contexts]
    assert languages[0] == "python" and contexts[0].id == fresh.sandbox_id
    assert "bash" in languages and len(set(languages)) == len(languages)
    assert {c.cwd for c in contexts} == {HOME}
    bash = contexts[languages.index("bash")]
    # Listed before its first use, and usable by its id (E2B's default JavaScript context is).
    assert fresh.run_code("n=6; echo $((n * 7))", context=bash).logs.stdout == ["42\n"]
    assert fresh.run_code("echo $n", language="bash").logs.stdout == ["6\n"]  # the same one
    fresh.restart_code_context(bash)
    assert fresh.run_code("echo ${n:-unset}", context=bash).logs.stdout == ["unset\n"]
    assert [c.id for c in fresh.list_code_contexts()] == [c.id for c in contexts]


def test_a_created_context_is_listed_last(fresh: Sandbox) -> None:
    created = fresh.create_code_context()
    second = fresh.create_code_context(language="bash")
    listed = fresh.list_code_contexts()
    assert [(c.id, c.language, c.cwd) for c in listed[-2:]] == [
        (created.id, "python", HOME), (second.id, "bash", HOME)]
    fresh.remove_code_context(second)
    assert fresh.list_code_contexts()[-1].id == created.id


def test_javascript_has_its_context_listed_and_typescript_shares_it(fresh: Sandbox) -> None:
    contexts = {c.language: c for c in fresh.list_code_contexts()}
    assert {"python", "javascript", "r", "bash"} <= set(contexts)  # E2B's suite reads these
    assert "typescript" not in contexts  # it runs in JavaScript's kernel
    fresh.run_code("const shared = 'js'", context=contexts["javascript"])
    assert fresh.run_code("shared", language="ts").text == "js"


# -- a sandbox killed while its code runs ------------------------------------------------------


def test_run_code_raises_timeout_when_the_sandbox_is_killed_meanwhile(fresh: Sandbox) -> None:
    timer = threading.Timer(2.0, fresh.kill)
    timer.start()
    try:
        with pytest.raises(TimeoutException,
                           match="sandbox was killed while the request was in progress"):
            fresh.run_code("import time; time.sleep(300)", timeout=300)
    finally:
        timer.cancel()


async def test_async_run_code_raises_timeout_when_the_sandbox_is_killed_meanwhile(
        e2b_env: dict[str, str]) -> None:
    sandbox = await AsyncSandbox.create()
    timer = threading.Timer(2.0, Sandbox.kill, args=(sandbox.sandbox_id,))
    timer.start()
    try:
        with pytest.raises(TimeoutException, match="killed while the request"):
            await sandbox.run_code("print('started', flush=True); import time; "
                                   "time.sleep(300)", timeout=300)
    finally:
        timer.cancel()
        await sandbox.kill()


def test_a_kernel_that_dies_in_a_living_sandbox_is_an_error_not_a_timeout(
        sandbox: Sandbox) -> None:
    died = sandbox.run_code("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert died.error is not None and died.error.name == "DeadKernelError"
    assert sandbox.is_running()
    assert sandbox.run_code("6 * 7").text == "42"


# -- data ------------------------------------------------------------------------------------


def test_a_dataframe_result_carries_its_columns_as_data(sandbox: Sandbox) -> None:
    execution = sandbox.run_code(
        "import pandas as pd, numpy as np\n"
        "pd.DataFrame({'a': [1, 2, 3], 'f': [0.5, np.nan, 2.0],\n"
        "              't': pd.to_datetime(['2024-01-02', None, '2024-03-04 05:06:07'],\n"
        "                              format='ISO8601'),\n"
        "              7: ['x', None, {'k'}], 'n': pd.array([1, None, 3], dtype='Int64')})")
    (result,) = execution.results
    assert result.data == {
        "a": [1, 2, 3], "f": [0.5, None, 2.0],
        "t": ["2024-01-02T00:00:00", None, "2024-03-04T05:06:07"], "7": ["x", None, "{'k'}"],
        "n": [1, None, 3]}
    assert result.html and "data" in result.formats() and not result.extra


def test_a_dataframe_too_big_for_its_data_keeps_its_text_and_html(sandbox: Sandbox) -> None:
    execution = sandbox.run_code("import numpy as np, pandas as pd\n"
                                 "pd.DataFrame(np.zeros((1_000_000, 4)))")
    (result,) = execution.results
    assert result.data is None
    assert "1000000 rows" in result.html and "omitted" not in result.text


def test_a_list_or_dict_result_is_also_json(sandbox: Sandbox, gateway: GatewayProcess) -> None:
    execution = sandbox.run_code("import numpy as np\n{'a': [1, 2.5, None], 'n': np.arange(3)}")
    assert execution.results[0].json == {"a": [1, 2.5, None], "n": [0, 1, 2]}
    assert execution.results[0].formats() == ["text", "json"]
    assert sandbox.run_code("[1, 'two']").results[0].json == [1, "two"]
    assert sandbox.run_code("[object()]").results[0].json is None  # not JSON data
    assert sandbox.run_code("(1, 2)").results[0].json is None  # E2B's: lists and dicts only
    # Not as application/json elsewhere: Jupyter's front ends would show it instead of the text.
    native = httpx.post(f"{gateway.url}/v1/sessions/{sandbox.sandbox_id}/execute",
                        json={"code": "{'a': 1}"}, headers=gateway.headers(), timeout=60)
    (output,) = native.json()["outputs"]
    assert "application/json" not in output["data"] and output["data"]["text/plain"] == "{'a': 1}"


def test_a_figure_shown_is_png_text_and_chart_with_nothing_extra(sandbox: Sandbox) -> None:
    execution = sandbox.run_code("import matplotlib.pyplot as plt\n"
                                 "plt.plot([1, 2, 3], [2, 4, 1])\nplt.show()")
    (result,) = execution.results
    assert result.png and result.text and result.chart is not None and not result.extra


# -- images ----------------------------------------------------------------------------------

IMAGE = ("import numpy\nfrom PIL import Image\n"
         "image = Image.fromarray((numpy.random.rand(16, 16, 3) * 255).astype('uint8'))\n")


def test_saving_a_pil_image_to_a_path_also_shows_it(sandbox: Sandbox) -> None:
    execution = sandbox.run_code(IMAGE + "image.save('saved.png')\nprint('saved')")
    (result,) = execution.results
    assert result.png and execution.logs.stdout == ["saved\n"]
    assert sandbox.files.read("saved.png", format="bytes")[:4] == b"\x89PNG"
    to_memory = sandbox.run_code(IMAGE + "import io\nimage.save(io.BytesIO(), 'PNG')")
    assert to_memory.results == [] and to_memory.error is None


def test_show_displays_a_pil_image(sandbox: Sandbox) -> None:
    shown = sandbox.run_code(IMAGE + "image.convert('RGBA').show()")
    assert shown.error is None and [bool(r.png) for r in shown.results] == [True]
    # A mode PNG cannot hold is converted, as PIL's own viewer for IPython does.
    floats = sandbox.run_code(IMAGE + "image.convert('F').show()")
    assert floats.error is None and floats.results[0].png
