"""Output caps: the limiter on its own, then floods through a real kernel."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest
from kp_support import run_ok

from kernel_pool import (
    DisplayEvent,
    ErrorEvent,
    KernelPool,
    OutputCaps,
    Session,
    StreamEvent,
    UpdateDisplayEvent,
)
from kernel_pool._caps import OutputLimiter

NOTICE = re.compile(r"\[replgate: output truncated: (\d+) characters in all, about \d+ shown; "
                    r"full text in (\S+)\]")
CAPS = OutputCaps(stream_chars=1_000, line_chars=200, display_bytes=2048, display_count=2)


def feed(limiter: OutputLimiter, pieces: list[tuple[str, str]]) -> tuple[str, str]:
    """Run pieces through the limiter, then finish: (all shown text, full spilled text)."""
    shown, spilled = [], []
    for name, text in pieces:
        shown.extend(event.text for event in limiter.stream(name, text))
        spilled.append(limiter.take_spill())
    shown.extend(event.text for event in limiter.finish())
    spilled.append(limiter.take_spill(final=True))
    return "".join(shown), "".join(spilled)


# -- the limiter on its own -----------------------------------------------------------------

def test_limiter_passes_output_under_the_caps() -> None:
    limiter = OutputLimiter(CAPS, "out.txt")
    shown, spilled = feed(limiter, [("stdout", "hello\n"), ("stderr", "warning\n")])
    assert shown == "hello\nwarning\n"
    assert spilled == ""
    assert limiter.truncated is False


def test_limiter_keeps_head_and_tail_when_over_the_cap() -> None:
    limiter = OutputLimiter(CAPS, "out.txt")
    lines = [f"line {i:04d}\n" for i in range(1000)]  # 10,000 characters
    shown, spilled = feed(limiter, [("stdout", line) for line in lines])
    assert limiter.truncated is True
    assert shown.startswith("line 0000\n")
    assert shown.endswith("line 0999\n")
    assert "line 0500" not in shown
    assert len(shown) < 1_300  # about the cap, plus the notice
    notice = NOTICE.search(shown)
    assert notice is not None and notice.group(1) == "10000" and notice.group(2) == "out.txt"
    assert spilled == "".join(lines)


def test_limiter_cuts_a_long_line() -> None:
    limiter = OutputLimiter(CAPS, "out.txt")
    shown, spilled = feed(limiter, [("stdout", "x" * 150), ("stdout", "x" * 150 + "\nnext\n")])
    assert shown.startswith("x" * 200 + " [... line truncated]\nnext\n")
    assert "full text in out.txt" in shown
    assert spilled == "x" * 300 + "\nnext\n"


def test_limiter_notice_says_when_the_file_is_incomplete() -> None:
    limiter = OutputLimiter(CAPS, "out.txt")
    for _ in range(20):
        limiter.stream("stdout", "w" * 99 + "\n")
    limiter.spill_incomplete = True
    shown = "".join(event.text for event in limiter.finish())
    assert "its start in out.txt (the workspace is full)" in shown


def test_limiter_cuts_lines_across_chunks() -> None:
    limiter = OutputLimiter(CAPS, "out.txt")
    pieces = [("stdout", "a" * 150), ("stdout", "a" * 100 + "\nb\n" + "c" * 300 + "\nd"),
              ("stdout", "d" * 10 + "\n")]
    shown, spilled = feed(limiter, pieces)
    cut = " [... line truncated]"
    assert shown.startswith("a" * 200 + cut + "\nb\n" + "c" * 200 + cut + "\n" + "d" * 11 + "\n")
    assert spilled == "".join(text for _, text in pieces)


def test_limiter_keeps_the_users_frames_in_the_short_form_of_a_cut_traceback() -> None:
    limiter = OutputLimiter(CAPS, "out.txt")
    library = [f"File /opt/venv/lib/python3.11/site-packages/lib/m{i}.py:1, in f{i}()\n"
               + "-" * 150 for i in range(20)]
    error = ErrorEvent(ename="KeyError", evalue="'k'", traceback=[
        "-" * 75, "KeyError        Traceback (most recent call last)",
        "Cell In[4], line 1\n----> 1 load()\n", *library, "KeyError: 'k'"])

    capped = limiter.error(error)

    assert capped is not None and limiter.truncated
    assert "Cell In[4]" not in capped.text  # the cut dropped the cell's frame from the text
    assert capped.short == ("Cell In[4], line 1\n----> 1 load()\n\n"
                            "[... 20 frames in library code]\n\nKeyError: 'k'")


def test_limiter_caps_display_count_and_size() -> None:
    limiter = OutputLimiter(CAPS, "out.txt")
    small = DisplayEvent(type="display", data={"text/plain": "ok"})
    big = DisplayEvent(type="display", data={"text/plain": "y" * 5000})
    assert limiter.display(small) == small
    replaced = limiter.display(big)
    assert replaced is not None and "omitted" in replaced.data["text/plain"]
    assert limiter.display(small) is None  # the third display is over the count
    update = UpdateDisplayEvent(data={"text/plain": "new"}, display_id="d")
    assert limiter.display(update) == update  # updates replace, they do not add
    shown = "".join(e.text for e in limiter.finish() if isinstance(e, StreamEvent))
    assert "1 more displays omitted" in shown
    assert limiter.truncated is True


def test_limiter_holds_bounded_text_whatever_the_flood() -> None:
    limiter = OutputLimiter(CAPS, "out.txt")
    chunk = "z" * 100_000
    for _ in range(200):  # 20 million characters
        limiter.stream("stdout", chunk)
        limiter.take_spill()
        assert sum(len(t) for _, t in limiter._tail) <= CAPS.stream_chars
        assert sum(map(len, limiter._pending_spill)) <= 1 << 21


# -- through a real kernel ------------------------------------------------------------------

@pytest.fixture(scope="module")
async def flood_session(pool: KernelPool) -> AsyncIterator[Session]:
    """A session for floods (their full text fills its workspace for a while)."""
    session = await pool.create_session()
    yield session
    await pool.delete_session(session.id)


async def peak_rss_while(awaitable: asyncio.Future[object] | asyncio.Task[object],
                         ) -> tuple[object, int]:
    """Await ``awaitable`` while sampling this process's RSS; (its result, RSS growth)."""
    process = psutil.Process()
    baseline = process.memory_info().rss
    peak = baseline

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, process.memory_info().rss)
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    try:
        result = await awaitable
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    return result, peak - baseline


def spill_file(session: Session, stderr: str) -> Path:
    notice = re.search(r"full text in (\S+)\]", stderr)
    assert notice is not None, stderr[:500]
    return Path(session.kernel.sandbox.workspace.root, notice.group(1))


async def test_flood_is_truncated_with_bounded_host_memory(flood_session: Session) -> None:
    code = "for i in range(100):\n    print(str(i % 10) * 1_000_000)"
    task = asyncio.ensure_future(flood_session.execute(code, timeout_s=120))
    result, growth = await peak_rss_while(task)
    assert growth < 200 * 2**20, f"the host grew by {growth / 2**20:.0f} MiB"
    assert hasattr(result, "status") and result.status == "ok"
    assert result.truncated is True
    caps = flood_session.profile.caps
    assert len(result.stdout) + len(result.stderr) < caps.stream_chars + 2_000
    # Each million-character line is also over the line cap: cut, and marked so.
    assert result.stdout.startswith("0" * 1000)
    assert result.stdout.endswith("9" * 1000 + " [... line truncated]\n")
    notice = NOTICE.search(result.stderr)
    assert notice is not None and int(notice.group(1)) == 100 * 1_000_001
    full = spill_file(flood_session, result.stderr)
    assert full.stat().st_size == 100 * 1_000_001
    with full.open() as f:
        assert f.read(12) == "0" * 12
        f.seek(99 * 1_000_001)
        assert f.read() == "9" * 1_000_000 + "\n"
    full.unlink()
    assert await run_ok(flood_session, "print('usable')") == "usable\n"


async def test_single_huge_line_is_cut_with_bounded_host_memory(flood_session: Session) -> None:
    task = asyncio.ensure_future(flood_session.execute("print('L' * 50_000_000)", timeout_s=120))
    result, growth = await peak_rss_while(task)
    assert growth < 200 * 2**20, f"the host grew by {growth / 2**20:.0f} MiB"
    assert hasattr(result, "status") and result.status == "ok"
    assert result.truncated is True
    line_chars = flood_session.profile.caps.line_chars
    assert result.stdout.startswith("L" * line_chars + " [... line truncated]")
    assert len(result.stdout) + len(result.stderr) < 2 * line_chars + 1_000
    full = spill_file(flood_session, result.stderr)
    assert full.stat().st_size == 50_000_001
    full.unlink()
    assert await run_ok(flood_session, "print('usable')") == "usable\n"


async def test_display_count_is_capped(shared_session: Session) -> None:
    limit = shared_session.profile.caps.display_count
    result = await shared_session.execute(
        f"from IPython.display import display\nfor i in range({limit + 10}):\n    display(i)")
    assert result.status == "ok"
    assert len(result.outputs) == limit
    assert result.truncated is True
    assert "10 more displays omitted" in result.stderr
