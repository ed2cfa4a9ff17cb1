"""The execution engine: persistence, rich outputs, streaming, attribution, queueing."""

from __future__ import annotations

import asyncio
import base64
import re
import time

import pytest
from kp_support import run_ok

from kernel_pool import DisplayEvent, DoneEvent, InvalidRequest, QueueFull, Session, StreamEvent

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


async def test_execute_keeps_state_across_executions(shared_session: Session) -> None:
    await run_ok(shared_session, "persisted = [1, 2, 3]\ndef double(x):\n    return 2 * x")
    result = await shared_session.execute("double(sum(persisted))")
    assert result.status == "ok"
    assert result.outputs[0].type == "result"
    assert result.outputs[0].data["text/plain"] == "12"


async def test_execute_counts_executions(shared_session: Session) -> None:
    first = await shared_session.execute("1")
    second = await shared_session.execute("2")
    assert first.execution_count is not None
    assert second.execution_count == first.execution_count + 1
    assert shared_session.execution_count == second.execution_count


async def test_execute_reports_error_as_data(shared_session: Session) -> None:
    result = await shared_session.execute("def f():\n    return 1 / 0\nf()")
    assert result.status == "error"
    assert result.error is not None
    assert result.error.ename == "ZeroDivisionError"
    assert "division by zero" in result.error.evalue
    plain = ANSI.sub("", result.error.traceback)  # E2B's one string
    assert "return 1 / 0" in plain


async def test_execute_returns_png_when_matplotlib_plots(shared_session: Session) -> None:
    result = await shared_session.execute(
        "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('replgate')\nplt.show()")
    assert result.status == "ok", result.error
    images = [o for o in result.outputs if "image/png" in o.data]
    assert len(images) == 1
    png = base64.b64decode(images[0].data["image/png"])
    assert png.startswith(PNG_SIGNATURE)
    assert len(png) > 1000


async def test_display_keeps_mime_types(shared_session: Session) -> None:
    result = await shared_session.execute("""
from IPython.display import HTML, JSON, SVG, Markdown, display
display(HTML("<b>bold</b>"))
display(SVG('<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"></svg>'))
display(JSON({"answer": 42}))
display(Markdown("*md*"))
""")
    assert result.status == "ok", result.error
    kinds = [o.data for o in result.outputs]
    assert kinds[0]["text/html"] == "<b>bold</b>"
    assert "<svg" in kinds[1]["image/svg+xml"]
    assert kinds[2]["application/json"] == {"answer": 42}
    assert kinds[3]["text/markdown"] == "*md*"
    assert all("text/plain" in data for data in kinds)
    assert all(o.type == "display" for o in result.outputs)


async def test_clear_output_honoured_in_aggregate(shared_session: Session) -> None:
    result = await shared_session.execute("""
from IPython.display import clear_output, display
print("before")
display("shown before")
clear_output()
print("after")
clear_output(wait=True)
print("last")
""")
    assert result.status == "ok", result.error
    assert result.stdout == "last\n"
    assert result.outputs == []


async def test_update_display_honoured_in_aggregate(shared_session: Session) -> None:
    result = await shared_session.execute("""
from IPython.display import display
handle = display("first", display_id=True)
display("other")
handle.update("second")
""")
    assert result.status == "ok", result.error
    texts = [o.data["text/plain"] for o in result.outputs]
    assert texts == ["'second'", "'other'"]


async def test_stream_yields_events_in_order_while_running(shared_session: Session) -> None:
    handle = shared_session.submit(
        "import sys, time\nprint('one', flush=True)\ntime.sleep(1.0)\n"
        "print('two', flush=True)\nprint('three', file=sys.stderr)\n3")
    started = time.monotonic()
    arrivals: list[tuple[float, object]] = []
    async for event in handle.stream():
        arrivals.append((time.monotonic() - started, event))
    events = [event for _, event in arrivals]
    texts = [(e.type, e.text) for e in events if isinstance(e, StreamEvent)]
    assert texts == [("stdout", "one\n"), ("stdout", "two\n"), ("stderr", "three\n")]
    assert isinstance(events[-2], DisplayEvent) and events[-2].type == "result"
    assert isinstance(events[-1], DoneEvent) and events[-1].status == "ok"
    first_at = next(t for t, e in arrivals if isinstance(e, StreamEvent))
    done_at = arrivals[-1][0]
    assert done_at - first_at > 0.8, "the first output must arrive while the code still runs"
    # A late reader gets the whole stream from the start.
    replay = [event async for event in handle.stream()]
    assert replay == events


async def test_background_thread_output_stays_with_its_execution(
        shared_session: Session) -> None:
    first = await shared_session.execute("""
import threading, time
def late():
    time.sleep(0.5)
    print("LATE from a thread", flush=True)
threading.Thread(target=late).start()
print("cell one")
""")
    second = await shared_session.execute("import time\ntime.sleep(1.5)\nprint('cell two')")
    assert first.stdout == "cell one\n"
    assert second.stdout == "cell two\n"
    assert "LATE" not in second.stdout + second.stderr


async def test_input_fails_fast(shared_session: Session) -> None:
    started = time.monotonic()
    result = await shared_session.execute("name = input('your name? ')", timeout_s=20)
    assert time.monotonic() - started < 5
    assert result.status == "error"
    assert result.error is not None
    assert "input" in (result.error.ename + result.error.evalue).lower()


async def test_execute_reports_resource_usage(shared_session: Session) -> None:
    result = await shared_session.execute(
        "import numpy as np\nblock = np.ones(64 * 2**20 // 8)\nsum(range(3_000_000))\ndel block")
    assert result.status == "ok", result.error
    assert result.metrics.cpu_time_ms is not None and result.metrics.cpu_time_ms > 10
    assert result.duration_ms > 0
    if result.metrics.peak_memory_bytes is not None:
        assert result.metrics.peak_memory_bytes > 64 * 2**20


async def test_executions_run_one_at_a_time_in_order(shared_session: Session) -> None:
    handles = [shared_session.submit(f"import time\ntime.sleep(0.1)\nprint({i})")
               for i in range(3)]
    results = [await handle.result() for handle in handles]
    assert [r.stdout for r in results] == ["0\n", "1\n", "2\n"]
    counts = [r.execution_count for r in results]
    assert counts == sorted(counts) and len(set(counts)) == 3


async def test_submit_raises_queue_full_beyond_limit(shared_session: Session) -> None:
    limit = 4  # max_queued_executions of the tests' settings
    handles = [shared_session.submit("import time\ntime.sleep(0.2)") for _ in range(limit)]
    with pytest.raises(QueueFull) as caught:
        shared_session.submit("1")
    assert caught.value.session_id == shared_session.id
    results = await asyncio.gather(*(handle.result() for handle in handles))
    assert [r.status for r in results] == ["ok"] * limit
    assert (await shared_session.execute("'room again'")).status == "ok"


@pytest.mark.parametrize("timeout_s", [0, -1, 121])
def test_submit_rejects_timeout_out_of_range(shared_session: Session, timeout_s: float) -> None:
    with pytest.raises(InvalidRequest, match="timeout_s"):
        shared_session.submit("1", timeout_s=timeout_s)


async def test_execute_reports_error_when_a_display_formatter_raises(
        shared_session: Session) -> None:
    result = await shared_session.execute(
        "class Broken:\n    def _repr_html_(self):\n        raise ValueError('no html')\nBroken()")
    assert result.error is not None
    assert result.error.ename == "ValueError"
    assert result.status == "error"


async def test_stream_never_splits_a_line_flushed_in_pieces(shared_session: Session) -> None:
    # Each flush sends what is buffered, so this sends "step" and " 1\n" as two messages: the
    # way a flush timer falling inside print('step', 1, flush=True) splits it.
    handle = shared_session.submit(
        "import sys\nfor i in range(20):\n    sys.stdout.write('step'); sys.stdout.flush()\n"
        "    sys.stdout.write(f' {i}\\n'); sys.stdout.flush()\n"
        "    sys.stderr.write('warn'); sys.stderr.flush()\n"
        "    print(' !', file=sys.stderr, flush=True)")
    texts = [(e.type, e.text) async for e in handle.stream() if isinstance(e, StreamEvent)]
    assert all(text.endswith("\n") for _, text in texts), texts
    stdout = "".join(text for name, text in texts if name == "stdout")
    assert stdout == "".join(f"step {i}\n" for i in range(20))
    assert [text for name, text in texts if name == "stderr"] == ["warn !\n"] * 20


async def test_stream_sends_an_unfinished_line_after_a_moment(shared_session: Session) -> None:
    handle = shared_session.submit(
        "import time\nprint('working', end='', flush=True)\ntime.sleep(1.0)\nprint(' done')")
    started = time.monotonic()
    arrivals = [(time.monotonic() - started, e) async for e in handle.stream()
                if isinstance(e, StreamEvent)]
    assert [e.text for _, e in arrivals] == ["working", " done\n"]
    assert arrivals[1][0] - arrivals[0][0] > 0.5, "a progress indicator shows while it runs"
