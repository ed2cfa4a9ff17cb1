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
    """Holds the unfinished last line of each stream until it ends, another output comes, or
    :data:`HOLD_S` passes (see :attr:`deadline`)."""

    def __init__(self) -> None:
        self._held: dict[str, str] = {}
        self.deadline: float | None = None
        """Loop time by which :meth:`flush` must be called, while something is held."""

    def add(self, event: StreamEvent, now: float) -> list[StreamEvent]:
        """Events to send now for ``event``: whole lines, in order; the rest is held."""
        out: list[StreamEvent] = []
        for name in [n for n in self._held if n != event.type]:
            # the other stream's unfinished line came first: it goes first
            out.append(StreamEvent(type=name, text=self._held.pop(name)))
        held = self._held.pop(event.type, "")
        text = held + event.text
        cut = text.rfind("\n") + 1
        if len(text) - cut > MAX_HELD_CHARS:
            cut = len(text)
        if cut:
            out.append(StreamEvent(type=event.type, text=text[:cut]))
        if cut < len(text):
            if not held or cut or self.deadline is None:  # a new unfinished line
                self.deadline = now + HOLD_S
            self._held[event.type] = text[cut:]
        else:
            self.deadline = None
        return out

    def flush(self) -> list[StreamEvent]:
        """Everything held, to send before another kind of output or the end."""
        out = [StreamEvent(type=name, text=text)
               for name, text in self._held.items()]
        self._held.clear()
        self.deadline = None
        return out
