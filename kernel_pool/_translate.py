"""A kernel's output message as a typed event (:func:`translate`), read from untrusted content:
every field checked for its type, a bundle's keys made strings, a chart split from its image."""

from __future__ import annotations

from typing import Any

from kernel_pool._results import split_chart
from kernel_pool.events import (
    ClearOutputEvent,
    DisplayEvent,
    ErrorEvent,
    OutputEvent,
    StreamEvent,
    UpdateDisplayEvent,
)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(map(_text, value))
    return "" if value is None else str(value)


def _bundle(value: Any) -> dict[str, Any]:
    """A MIME bundle from untrusted content: string keys only."""
    if not isinstance(value, dict):
        return {}
    return {str(k): (v if isinstance(v, str | dict | list | int | float | bool) else str(v))
            for k, v in value.items()}


def _omitted(value: Any) -> dict[str, int] | None:
    """The kernel's ``omitted`` sizes, from untrusted content: string keys, int sizes."""
    if not isinstance(value, dict) or not value:
        return None
    return {str(k): v if isinstance(v, int) and not isinstance(v, bool) else 0
            for k, v in list(value.items())[:64]}


def translate(msg: dict[str, Any]) -> OutputEvent | None:
    """One iopub message as an event (None for messages that carry no output)."""
    kind = msg.get("msg_type")
    content = msg.get("content") if isinstance(msg.get("content"), dict) else {}
    assert isinstance(content, dict)
    if kind == "stream":
        name = "stderr" if content.get("name") == "stderr" else "stdout"
        return StreamEvent(type=name, text=_text(content.get("text")))
    if kind in ("display_data", "execute_result", "update_display_data"):
        transient = content.get("transient")
        display_id = transient.get("display_id") if isinstance(transient, dict) else None
        data, metadata = _bundle(content.get("data")), _bundle(content.get("metadata"))
        omitted = _omitted(content.get("omitted"))
        if kind == "update_display_data":
            if not isinstance(display_id, str):
                return None
            return UpdateDisplayEvent(data=data, metadata=metadata, display_id=display_id,
                                      omitted=omitted)
        data, chart = split_chart(data)
        return DisplayEvent(type="result" if kind == "execute_result" else "display", data=data,
                            metadata=metadata, chart=chart,
                            display_id=display_id if isinstance(display_id, str) else None,
                            omitted=omitted)
    if kind == "error":
        traceback = content.get("traceback")
        return ErrorEvent(ename=_text(content.get("ename")), evalue=_text(content.get("evalue")),
                          traceback=[_text(line) for line in traceback]
                          if isinstance(traceback, list) else [])
    if kind == "clear_output":
        return ClearOutputEvent(wait=bool(content.get("wait")))
    return None
