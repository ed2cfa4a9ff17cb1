"""Whole lines out of stream fragments (the execution loop's LineJoiner, on its own)."""

from __future__ import annotations

from kernel_pool._lines import HOLD_S, MAX_HELD_CHARS, LineJoiner
from kernel_pool.events import StreamEvent


def out(type_: str, text: str) -> StreamEvent:
    return StreamEvent(type=type_, text=text)  # type: ignore[arg-type]


def test_add_joins_fragments_of_one_line() -> None:
    joiner = LineJoiner()
    assert joiner.add(out("stdout", "step"), now=0.0) == []
    assert joiner.deadline == HOLD_S
    assert joiner.add(out("stdout", " 1\nst"), now=0.01) == [out("stdout", "step 1\n")]
    assert joiner.deadline == 0.01 + HOLD_S  # a new unfinished line: a hold of its own
    assert joiner.flush() == [out("stdout", "st")]
    assert joiner.deadline is None


def test_add_keeps_the_first_deadline_of_a_line_that_goes_on() -> None:
    joiner = LineJoiner()
    for step in range(5):
        assert joiner.add(out("stdout", "."), now=step * 0.01) == []
    assert joiner.deadline == HOLD_S


def test_add_holds_the_two_streams_apart() -> None:
    joiner = LineJoiner()
    assert joiner.add(out("stdout", "a"), now=0.0) == []
    assert joiner.add(out("stderr", "warn\n"), now=0.0) == [out("stderr", "warn\n")]
    assert joiner.add(out("stdout", "b\n"), now=0.0) == [out("stdout", "ab\n")]


def test_add_cuts_a_line_longer_than_the_cap() -> None:
    joiner = LineJoiner()
    long = "x" * (MAX_HELD_CHARS + 1)
    assert joiner.add(out("stdout", long), now=0.0) == [out("stdout", long)]
    assert joiner.deadline is None
