"""Whole lines out of a kernel's stream messages.

The kernel sends what a stream buffered whenever it flushes, and a flush can fall inside one
``print``: ``print('step', 1, flush=True)`` writes ``step``, `` ``, ``1`` and a newline, and a
flush timer left from an earlier print may send ``step`` alone. An unfinished line is therefore
held back for :data:`HOLD_S` waiting for its end, so a stream event never splits a line the code
wrote at once. This is done on the host, in the execution loop, not in the kernel: every API
(HTTP, WebSocket, MCP, Jupyter, E2B, the client) reads the loop's events, and the host sees the
bytes the code wrote to file descriptor 1 or 2, or through a ``sys.stdout`` it replaced, which
no patch inside the kernel would.

A line longer than :data:`MAX_HELD_CHARS` is still sent in pieces (the output caps then apply
to it as usual); so is a partial line the code leaves unfinished for longer than the hold (a
progress indicator), which is what the code asked for.
"""

from __future__ import annotations

from kernel_pool.events import StreamEvent

HOLD_S = 0.05
"""How long an unfinished line waits for its end: well above the microseconds between the
pieces of one print, well below what a person watching live output notices."""
MAX_HELD_CHARS = 256 * 1024
"""An unfinished line longer than this is sent as it is (the kernel's own message chunk)."""


class LineJoiner:
    """Holds the unfinished last line of each stream until it ends, another kind of output
    comes, or :data:`HOLD_S` passes (see :attr:`deadline`). The two streams are held apart: the
    kernel buffers and flushes them apart too, so their order relative to each other is only
    ever approximate."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[str, float]] = {}
        """Per stream: its unfinished line, and the loop time by which it goes out."""

    @property
    def deadline(self) -> float | None:
        """Loop time by which :meth:`flush` must be called, while something is held."""
        return min((due for _, due in self._held.values()), default=None)

    def add(self, event: StreamEvent, now: float) -> list[StreamEvent]:
        """Events to send now for ``event``: its whole lines; an unfinished end is held."""
        held, due = self._held.pop(event.type, ("", now + HOLD_S))
        text = held + event.text
        cut = text.rfind("\n") + 1
        if len(text) - cut > MAX_HELD_CHARS:
            cut = len(text)
        if cut < len(text):
            # a line that goes on keeps its first deadline; a new one gets its own
            self._held[event.type] = (text[cut:], now + HOLD_S if cut else due)
        return [StreamEvent(type=event.type, text=text[:cut])] if cut else []

    def flush(self) -> list[StreamEvent]:
        """Everything held, to send before another kind of output or the end."""
        out = [StreamEvent(type=name, text=text)
               for name, (text, _) in self._held.items()]
        self._held.clear()
        return out
