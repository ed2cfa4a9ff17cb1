"""Output caps: what one execution may return, the rest spilled to a workspace file.

Streams keep a head (shown live) and a tail (shown at the end, after a notice naming the file
with the full text). A line longer than the line cap is cut. Displays over the size cap, or
past the count cap, are replaced by a short notice; rich outputs past the total budget (and
errors past a few) are dropped, and an error's value and traceback are cut to the text caps.
The limiter holds at most about the caps' worth of output in memory, whatever the kernel sends
(the kernel is untrusted: a forged flood of updates, clears or errors counts like any output).
"""

from __future__ import annotations

import json
import logging
from collections import deque
from typing import Any

import anyio.to_thread

from kernel_pool._tracebacks import short_form
from kernel_pool._workspace import Workspace
from kernel_pool.config import OutputCaps
from kernel_pool.events import (
    ClearOutputEvent,
    DisplayEvent,
    ErrorEvent,
    StreamEvent,
    UpdateDisplayEvent,
)
from kernel_pool.exceptions import WorkspaceError

logger = logging.getLogger(__name__)

SPILL_DIR = ".replgate/outputs"
SPILL_FLUSH_CHARS = 1 << 20
EVENT_MIN_COST = 1024
"""Bytes of the rich-output budget every kept display, update or clear costs at least."""
ERRORS_KEPT = 4
"""Error events kept per execution (the kernel sends one; more are forged)."""


class OutputLimiter:
    """Applies :class:`OutputCaps` to one execution's outputs, in arrival order."""

    def __init__(self, caps: OutputCaps, spill_path: str) -> None:
        self.caps = caps
        self.spill_path = spill_path
        """Workspace-relative file that receives the full stream text once a cap is hit."""
        self.truncated = False
        self.total_chars = 0
        self._head_left = caps.stream_chars // 2
        self._tail: deque[tuple[str, str]] = deque()
        self._tail_chars = 0
        self._line_len = {"stdout": 0, "stderr": 0}
        self._line_cut = {"stdout": False, "stderr": False}
        self._displays = 0
        self._displays_dropped = 0
        self._budget_left = caps.display_total_bytes
        self._errors = 0
        self._spilling = False
        self._seen: list[str] = []
        self.spill_incomplete = False
        """Set when the spill file could not take everything (the workspace is full)."""
        self._pending_spill: list[str] = []

    # -- streams -----------------------------------------------------------------------------

    def stream(self, name: str, text: str) -> list[StreamEvent]:
        """Events to send now for ``text`` arriving on stream ``name``."""
        self.total_chars += len(text)
        self._record(text)
        text = self._cut_lines(name, text)
        if not text:
            return []
        if self._head_left > 0:
            shown, rest = text[: self._head_left], text[self._head_left :]
            self._head_left -= len(shown)
            if rest:
                self._keep_tail(name, rest)
            return [StreamEvent(type=name, text=shown)]
        self._keep_tail(name, text)
        return []

    def _cut_lines(self, name: str, text: str) -> str:
        limit = self.caps.line_chars
        lines = text.split("\n")
        last = len(lines) - 1
        if self._line_len[name] + len(lines[0]) <= limit and max(map(len, lines)) <= limit:
            # The common case, checked in C: no line reaches the cap; the text passes as it is.
            self._line_len[name] = len(lines[-1]) if last else self._line_len[name] + len(text)
            return text
        pieces = []
        for index, body in enumerate(lines):
            room = max(0, limit - self._line_len[name])
            if len(body) <= room:
                pieces.append(body)
            else:
                pieces.append(body[:room])
                if not self._line_cut[name]:
                    pieces.append(" [... line truncated]")
                    self._line_cut[name] = True
                    self.truncated = True
                    self._start_spill()
            if index < last:
                pieces.append("\n")
                self._line_len[name], self._line_cut[name] = 0, False
            else:
                self._line_len[name] += len(body)
        return "".join(pieces)

    def _keep_tail(self, name: str, text: str) -> None:
        self.truncated = True
        self._start_spill()
        self._tail.append((name, text))
        self._tail_chars += len(text)
        budget = self.caps.stream_chars - self.caps.stream_chars // 2
        while self._tail_chars - len(self._tail[0][1]) >= budget:
            self._tail_chars -= len(self._tail.popleft()[1])

    def _record(self, text: str) -> None:
        if self._spilling:
            self._pending_spill.append(text)
        else:
            self._seen.append(text)

    def _start_spill(self) -> None:
        if not self._spilling:
            self._spilling = True
            self._pending_spill = self._seen + self._pending_spill
            self._seen = []

    def take_spill(self, final: bool = False) -> str:
        """Full text to append to the spill file now (batched; everything when ``final``)."""
        if not self._spilling:
            return ""
        if not final and sum(map(len, self._pending_spill)) < SPILL_FLUSH_CHARS:
            return ""
        text, self._pending_spill = "".join(self._pending_spill), []
        return text

    def finish(self) -> list[StreamEvent]:
        """The notice and the kept tail, to send before the execution's end."""
        if not self.truncated:
            return []
        events: list[StreamEvent] = []
        where = (f"full text in {self.spill_path}" if not self.spill_incomplete else
                 f"its start in {self.spill_path} (the workspace is full)")
        if self._tail:
            notice = (f"\n[replgate: output truncated: {self.total_chars} characters in all, "
                      f"about {self.caps.stream_chars} shown; {where}]\n")
            name, first = self._tail[0]
            excess = self._tail_chars - (self.caps.stream_chars - self.caps.stream_chars // 2)
            if excess > 0:
                self._tail[0] = (name, first[excess:])
            events.append(StreamEvent(type="stderr", text=notice))
            events.extend(StreamEvent(type=n, text=t) for n, t in self._tail)
        elif self._spilling:
            events.append(StreamEvent(type="stderr", text=(
                f"\n[replgate: long lines truncated; {where}]\n")))
        if self._displays_dropped:
            events.append(StreamEvent(type="stderr", text=(
                f"[replgate: {self._displays_dropped} more displays omitted "
                f"(limit {self.caps.display_count} per execution, "
                f"{self.caps.display_total_bytes} bytes in all)]\n")))
        return events

    # -- displays ----------------------------------------------------------------------------

    def display(self, event: DisplayEvent | UpdateDisplayEvent,
                ) -> DisplayEvent | UpdateDisplayEvent | None:
        """The event to send (possibly replaced by a notice), or None to drop it."""
        if isinstance(event, DisplayEvent):
            if self._displays >= self.caps.display_count:
                self._displays_dropped += 1
                self.truncated = True
                return None
            self._displays += 1
        if event.omitted:  # the kernel replaced it already (its own copy of this cap)
            self.truncated = True
        chart = event.chart if isinstance(event, DisplayEvent) else None
        size = payload_size(event.data) + payload_size(event.metadata) + payload_size(chart or {})
        if size <= self.caps.display_bytes:
            if self._spend(size):
                return event
            self._displays_dropped += 1
            return None
        self.truncated = True
        omitted = {mime: payload_size(value) for mime, value in event.data.items()}
        note = (f"[replgate: output of {size} bytes omitted (limit {self.caps.display_bytes} "
                f"bytes); save large results to a file instead]")
        if not self._spend(len(note)):
            self._displays_dropped += 1
            return None
        update: dict[str, Any] = {"data": {"text/plain": note}, "metadata": {},
                                  "omitted": omitted}
        if chart is not None:
            update["chart"] = None
        return event.model_copy(update=update)

    def clear(self, event: ClearOutputEvent) -> ClearOutputEvent | None:
        """A clear_output to send, or None once the rich-output budget is spent."""
        return event if self._spend(0) else None

    def error(self, event: ErrorEvent) -> ErrorEvent | None:
        """The error cut to the text caps (value to a line, traceback to the stream cap,
        keeping its first and last entries), or None past the first few."""
        if self._errors >= ERRORS_KEPT:
            self.truncated = True
            return None
        self._errors += 1
        line, budget = self.caps.line_chars, self.caps.stream_chars
        lines = [_clip(text, line) for text in event.traceback]
        # made before entries are dropped, which may be the user's frames
        short = _clip(short_form(lines), budget)
        kept = sum(map(len, lines))
        dropped = 0
        while kept > budget and len(lines) > 2:
            kept -= len(lines.pop(1))
            dropped += 1
        if dropped:
            lines.insert(1, f"[... {dropped} traceback entries omitted]")
        capped = ErrorEvent(ename=_clip(event.ename, line), evalue=_clip(event.evalue, line),
                            traceback=lines, short=short)
        if capped != event:
            self.truncated = True
        return capped

    def _spend(self, size: int) -> bool:
        """Take ``size`` bytes (at least :data:`EVENT_MIN_COST`) from the rich-output budget."""
        cost = max(size, EVENT_MIN_COST)
        if cost > self._budget_left:
            self.truncated = True
            self._budget_left = 0
            return False
        self._budget_left -= cost
        return True


async def spill(limiter: OutputLimiter, workspace: Workspace, final: bool = False) -> None:
    """Append what the limiter has for its spill file to it, off the event loop. A workspace
    that is full keeps what fitted, and the limiter's notice says so."""
    text = limiter.take_spill(final)
    if text and not limiter.spill_incomplete:
        try:
            await anyio.to_thread.run_sync(workspace.append_text, limiter.spill_path, text)
        except (OSError, WorkspaceError) as exc:
            limiter.spill_incomplete = True
            logger.warning("could not keep the full output in %s: %s", limiter.spill_path, exc)


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]} [... {len(text) - limit} characters truncated]"


def payload_size(value: Any) -> int:
    """Size of a MIME bundle as it would travel (JSON-encoded)."""
    if isinstance(value, str):
        return len(value)
    try:
        return len(json.dumps(value))
    except (TypeError, ValueError):
        return len(str(value))
