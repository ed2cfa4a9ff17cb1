"""The notebook export: hand-made event lists in, a valid notebook out, and nbclient agrees."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nbformat
import pytest
from ipykernel.kernelspec import install as install_kernelspec
from jupyter_client.kernelspec import find_kernel_specs
from nbclient import NotebookClient

from gateway.notebook import NotebookCell, build_notebook

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAAAAAA6fptVAAAACklEQVR4nGNgAAAAAgABSK+kcQAAAABJRU5ErkJggg=="
SESSION = {"id": "s-123", "tenant": "acme", "profile": "default", "status": "idle",
           "execution_count": 9, "created_at": datetime(2024, 5, 1, 12, 0, tzinfo=UTC),
           "last_active_at": "2024-05-01T12:05:00+00:00"}


def done(count: int | None, status: str = "ok", **extra: Any) -> dict[str, Any]:
    return {"type": "done", "status": status, "execution_count": count, "truncated": False,
            "restarted": False, "duration_ms": 12.5, "execution_id": "e", **extra}


def out(text: str, name: str = "stdout") -> dict[str, Any]:
    return {"type": name, "text": text, "execution_id": "e"}


# (code, events it streams, outputs Jupyter keeps): the code really produces those events, so
# nbclient re-running the exported notebook must arrive at the same outputs.
CASES: list[tuple[str, list[dict[str, Any]]]] = [
    ("print(1+1)", [out("2\n")]),
    ("import sys\nprint('a')\nprint('b')\nsys.stdout.flush()\n"
     "print('oops', file=sys.stderr)\nsys.stderr.flush()\nprint('c')",
     [out("a\n"), out("b\n"), out("oops\n", "stderr"), out("c\n")]),
    ("from IPython.display import display, clear_output\n"
     f"display({{'image/png': '{PNG}', 'text/plain': '<dot>'}}, raw=True,\n"
     "        metadata={'image/png': {'width': 1}})",
     [{"type": "display", "data": {"image/png": PNG, "text/plain": "<dot>"},
       "metadata": {"image/png": {"width": 1}}}]),
    ("6 * 7", [{"type": "result", "data": {"text/plain": "42"}}]),
    ("print('gone')\nclear_output()\nprint('kept')",
     [out("gone\n"), {"type": "clear_output", "wait": False}, out("kept\n")]),
    ("print('old')\nclear_output(wait=True)\nprint('new')",
     [out("old\n"), {"type": "clear_output", "wait": True}, out("new\n")]),
    ("print('stays')\nclear_output(wait=True)",
     [out("stays\n"), {"type": "clear_output", "wait": True}]),
    ("print('wiped')\nclear_output()", [out("wiped\n"), {"type": "clear_output", "wait": False}]),
    ("h = display({'text/plain': 'v1'}, raw=True, display_id='bar')",
     [{"type": "display", "data": {"text/plain": "v1"}, "display_id": "bar"}]),
    ("h.update({'text/plain': 'v2'}, raw=True)",
     [{"type": "update_display", "data": {"text/plain": "v2"}, "display_id": "bar"}]),
    ("1/0", [{"type": "error", "ename": "ZeroDivisionError", "evalue": "division by zero",
              "traceback": ["Traceback ...", "ZeroDivisionError: division by zero"]}]),
]


def history() -> list[NotebookCell]:
    cells = []
    for count, (code, events) in enumerate(CASES, start=1):
        status = "error" if events[-1]["type"] == "error" else "ok"
        cells.append(NotebookCell(code=code, execution_count=count, status=status,
                                  events=[*events, done(count, status)]))
    return cells


def comparable(outputs: list[Any]) -> list[dict[str, Any]]:
    """Outputs reduced to what must match: streams merged, tracebacks (paths, colours) dropped."""
    result: list[dict[str, Any]] = []
    for output in outputs:
        item = dict(output)
        if item["output_type"] == "error":
            item.pop("traceback")
        if (item["output_type"] == "stream" and result
                and result[-1]["output_type"] == "stream" and result[-1]["name"] == item["name"]):
            result[-1]["text"] += item["text"]
            continue
        result.append(item)
    return result


@pytest.fixture
def python3_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The name of a python3 kernelspec, installed from the venv's ipykernel if none exists."""
    if "python3" not in find_kernel_specs():
        install_kernelspec(prefix=str(tmp_path / "prefix"))
        monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "prefix" / "share" / "jupyter"))
    return "python3"


def test_build_notebook_validates_as_nbformat_v4() -> None:
    notebook = build_notebook(SESSION, history())

    nbformat.validate(notebook)
    reread = nbformat.reads(json.dumps(notebook), as_version=4)
    nbformat.validate(reread)
    assert reread.nbformat == 4


def test_build_notebook_records_session_and_kernelspec() -> None:
    exported = datetime(2024, 5, 2, tzinfo=UTC)
    metadata = build_notebook(SESSION, [], exported_at=exported)["metadata"]

    assert metadata["kernelspec"] == {"name": "python3",
                                      "display_name": "Python 3 (replgate sandbox)",
                                      "language": "python"}
    assert metadata["language_info"] == {"name": "python"}
    assert metadata["replgate"] == {"session_id": "s-123", "tenant": "acme",
                                    "profile": "default",
                                    "created_at": "2024-05-01T12:00:00+00:00",
                                    "exported_at": "2024-05-02T00:00:00+00:00"}


def test_build_notebook_folds_every_output_type() -> None:
    cells = build_notebook(SESSION, history())["cells"]
    outputs = [cell["outputs"] for cell in cells]

    assert [cell["execution_count"] for cell in cells] == list(range(1, len(CASES) + 1))
    assert outputs[0] == [{"output_type": "stream", "name": "stdout", "text": "2\n"}]
    assert [(o["name"], o["text"]) for o in outputs[1]] == [
        ("stdout", "a\nb\n"), ("stderr", "oops\n"), ("stdout", "c\n")]
    assert outputs[2] == [{"output_type": "display_data",
                           "data": {"image/png": PNG, "text/plain": "<dot>"},
                           "metadata": {"image/png": {"width": 1}}}]
    assert outputs[3] == [{"output_type": "execute_result", "data": {"text/plain": "42"},
                           "metadata": {}, "execution_count": 4}]
    assert outputs[10] == [{"output_type": "error", "ename": "ZeroDivisionError",
                            "evalue": "division by zero",
                            "traceback": ["Traceback ...", "ZeroDivisionError: division by zero"]}]


def test_build_notebook_clears_immediately_without_wait() -> None:
    cells = build_notebook(SESSION, history())["cells"]

    assert [o["text"] for o in cells[4]["outputs"]] == ["kept\n"]
    assert cells[7]["outputs"] == []


def test_build_notebook_clears_on_next_output_with_wait() -> None:
    cells = build_notebook(SESSION, history())["cells"]

    assert [o["text"] for o in cells[5]["outputs"]] == ["new\n"]
    assert [o["text"] for o in cells[6]["outputs"]] == ["stays\n"]


def test_build_notebook_updates_display_in_earlier_cell() -> None:
    cells = build_notebook(SESSION, history())["cells"]

    assert cells[8]["outputs"][0]["data"] == {"text/plain": "v2"}
    assert cells[9]["outputs"] == []


def test_build_notebook_ignores_update_of_unknown_display() -> None:
    cell = NotebookCell(code="", execution_count=1, events=[
        {"type": "update_display", "data": {"text/plain": "x"}, "display_id": "nope"},
        {"type": "clear_output", "wait": True},
        {"type": "update_display", "data": {"text/plain": "x"}, "display_id": "nope"},
        done(1)])

    notebook = build_notebook(SESSION, [cell])

    assert notebook["cells"][0]["outputs"] == []


def test_build_notebook_marks_timeout_cell() -> None:
    notice = "[output truncated at 1 MiB; full text in .replgate/out-7.txt]\n"
    cell = NotebookCell(code="while True: print('x')", execution_count=None, status="timeout",
                        events=[out("x\n" + notice),
                                {"type": "future_event", "whatever": 1},
                                done(None, "timeout", restarted=True, truncated=True,
                                     reason="ran past timeout_s=1")])

    notebook = build_notebook(SESSION, [cell])
    exported = notebook["cells"][0]

    nbformat.validate(notebook)
    assert exported["execution_count"] is None
    assert exported["outputs"][0]["text"] == "x\n" + notice
    assert exported["metadata"]["replgate"] == {"status": "timeout", "restarted": True,
                                                "duration_ms": 12.5,
                                                "reason": "ran past timeout_s=1"}


def test_build_notebook_marks_ok_cell() -> None:
    exported = build_notebook(SESSION, history())["cells"][0]

    assert exported["metadata"]["replgate"] == {"status": "ok", "restarted": False,
                                                "duration_ms": 12.5, "reason": None}


async def test_rerun_exported_notebook_matches_outputs(python3_kernel: str,
                                                       tmp_path: Path) -> None:
    exported = build_notebook(SESSION, history())
    rerun = copy.deepcopy(exported)

    client = NotebookClient(rerun, kernel_name=python3_kernel, timeout=60, allow_errors=True,
                            resources={"metadata": {"path": str(tmp_path)}})
    await client.async_execute()

    assert rerun["cells"][0]["outputs"] == [
        {"output_type": "stream", "name": "stdout", "text": "2\n"}]
    for index, (ours, theirs) in enumerate(zip(exported["cells"], rerun["cells"], strict=True)):
        assert comparable(theirs["outputs"]) == comparable(ours["outputs"]), CASES[index][0]
        assert theirs["execution_count"] == ours["execution_count"]
