"""replgate's events as E2B's /execute lines (no gateway needed)."""

from __future__ import annotations

from gateway.e2b._results import Translator, result_line
from kernel_pool.events import DisplayEvent, DoneEvent, ErrorEvent, ExecutionStatus, StreamEvent


def test_result_line_maps_mime_types_to_fields_and_keeps_the_rest_in_extra() -> None:
    line = result_line({"text/plain": "'hi'", "image/png": "iVBO", "text/html": "<b>",
                        "application/vnd.custom": {"x": 1}}, True)
    assert line == {"type": "result", "is_main_result": True, "text": "hi", "png": "iVBO",
                    "html": "<b>", "extra": {"application/vnd.custom": {"x": 1}}}


def test_translator_joins_traceback_and_reports_count() -> None:
    translator = Translator()
    lines = translator.lines(ErrorEvent(ename="E", evalue="v", traceback=["a", "b"]))
    assert lines == [{"type": "error", "name": "E", "value": "v", "traceback": "a\nb"}]
    done = translator.lines(DoneEvent(status=ExecutionStatus.ERROR, execution_count=3,
                                      duration_ms=1.0))
    assert done == [{"type": "number_of_executions", "execution_count": 3}]


def test_translator_says_why_when_the_kernel_gave_no_error() -> None:
    translator = Translator()
    assert translator.lines(StreamEvent(type="stdout", text="x"))[0]["text"] == "x"
    done = translator.lines(DoneEvent(status=ExecutionStatus.DIED, execution_count=None,
                                      duration_ms=1.0, reason="out of memory"))
    assert done == [{"type": "error", "name": "DeadKernelError", "value": "out of memory",
                     "traceback": ""}]


def test_display_is_not_the_main_result() -> None:
    line = Translator().lines(DisplayEvent(type="display", data={"text/plain": "<Figure>"}))
    assert line[0]["is_main_result"] is False


def test_display_with_a_chart_carries_it_as_e2bs_chart() -> None:
    chart = {"type": "line", "title": "t", "elements": []}
    line = Translator().lines(DisplayEvent(type="display", data={"image/png": "iVBO"},
                                           chart=chart))
    assert line[0]["chart"] == chart
    assert "extra" not in line[0]
