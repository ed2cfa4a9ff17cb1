"""A session's history exported as an nbformat v4 notebook.

Each execution becomes one code cell. Its events are folded into outputs by the rules a Jupyter
client applies to IOPub messages (nbclient's, so a re-run of the notebook reproduces them):
consecutive stream text of one name is merged, ``clear_output(wait=True)`` clears only when the
next output arrives, and ``update_display`` (or a new display with a known ``display_id``)
rewrites every earlier output with that id, in whichever cell it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, TypeAdapter

from kernel_pool import (
    CHART_MIME,
    ClearOutputEvent,
    DisplayEvent,
    DoneEvent,
    ErrorEvent,
    Event,
    StreamEvent,
    UpdateDisplayEvent,
)

if TYPE_CHECKING:
    from nbformat import NotebookNode

_KERNELSPEC = {"name": "python3", "display_name": "Python 3 (replgate sandbox)",
               "language": "python"}



# nbformat's constructors, imported at the first export: importing nbformat (its validator's
# jsonschema, whose format checkers build rfc3987's grammar) was 40% of a gateway's start-up.
def _new_notebook(**fields: Any) -> NotebookNode:
    import nbformat.v4

    return nbformat.v4.new_notebook(**fields)  # type: ignore[no-untyped-call,no-any-return]


def _new_code_cell(**fields: Any) -> NotebookNode:
    import nbformat.v4

    return nbformat.v4.new_code_cell(**fields)  # type: ignore[no-untyped-call,no-any-return]


def _new_output(output_type: str, **fields: Any) -> NotebookNode:
    import nbformat.v4

    return nbformat.v4.new_output(output_type, **fields)  # type: ignore[no-untyped-call,no-any-return]


def _from_dict(data: dict[str, Any]) -> NotebookNode:
    import nbformat

    return nbformat.from_dict(data)  # type: ignore[no-untyped-call,no-any-return]

_EVENTS: TypeAdapter[Any] = TypeAdapter(Event)
_KNOWN_TYPES = {"stdout", "stderr", "display", "result", "update_display", "clear_output",
                "error", "done"}


class NotebookCell(BaseModel):
    """One execution of the session's history: its code and the events it streamed, in order."""

    code: str
    execution_count: int | None = None
    events: list[dict[str, Any]] = Field(default_factory=list)
    status: str = "ok"


def build_notebook(session: Mapping[str, Any], cells: list[NotebookCell], *,
                   exported_at: datetime | None = None) -> dict[str, Any]:
    """Build the notebook of ``session`` (a Session dict) from its executions, oldest first."""
    notebook = _new_notebook(metadata={
        "kernelspec": dict(_KERNELSPEC),
        "language_info": {"name": "python"},
        "replgate": {
            "session_id": session.get("id"),
            "tenant": session.get("tenant"),
            "profile": session.get("profile"),
            "created_at": _iso(session.get("created_at")),
            "exported_at": _iso(exported_at or datetime.now(UTC)),
        },
    })
    # Display ids outlive their cell: a later execution may update an earlier cell's output.
    displays: dict[str, list[NotebookNode]] = {}
    notebook.cells = [_code_cell(cell, displays) for cell in cells]
    return notebook


def _code_cell(cell: NotebookCell, displays: dict[str, list[NotebookNode]]) -> NotebookNode:
    outputs: list[NotebookNode] = []
    clear_pending = False
    done: DoneEvent | None = None
    for raw in cell.events:
        if raw.get("type") not in _KNOWN_TYPES:
            continue  # an event type from a newer gateway: export what we understand
        event = _EVENTS.validate_python(raw)
        if isinstance(event, DoneEvent):
            done = event
            continue
        if isinstance(event, ClearOutputEvent):
            if not event.wait:
                outputs.clear()
            clear_pending = event.wait
            continue
        if isinstance(event, UpdateDisplayEvent):
            _update(displays, event.display_id, event.data, event.metadata)
            continue  # an update changes outputs in place; it does not trigger a pending clear
        if isinstance(event, DisplayEvent) and event.display_id:
            _update(displays, event.display_id, event.data, event.metadata)
        if clear_pending:
            outputs.clear()
            clear_pending = False
        _append(outputs, event, cell.execution_count, displays)

    execution_count = cell.execution_count
    if execution_count is None and done is not None:
        execution_count = done.execution_count
    metadata = {"replgate": {
        "status": cell.status,
        "restarted": done.restarted if done else False,
        "duration_ms": done.duration_ms if done else None,
        "reason": done.reason if done else None,
    }}
    if done is not None and done.files:
        metadata["replgate"]["files"] = [f.model_dump() for f in done.files]
    if done is not None and done.language != "python":
        # A code context's cell: its language for readers, and in the key VS Code reads.
        metadata["replgate"]["language"] = done.language
        metadata["vscode"] = {"languageId": done.language}
    return _new_code_cell(source=cell.code, execution_count=execution_count, outputs=outputs,
                         metadata=metadata)


def _append(outputs: list[NotebookNode], event: StreamEvent | DisplayEvent | ErrorEvent,
            execution_count: int | None, displays: dict[str, list[NotebookNode]]) -> None:
    if isinstance(event, StreamEvent):
        name = event.type
        last = outputs[-1] if outputs else None
        if last is not None and last.output_type == "stream" and last.name == name:
            last.text += event.text
        else:
            outputs.append(_new_output("stream", name=name, text=event.text))
    elif isinstance(event, ErrorEvent):
        outputs.append(_new_output("error", ename=event.ename, evalue=event.evalue,
                                  traceback=event.traceback))
    else:
        # the chart goes back under the MIME type the kernel sent it as
        data = {**event.data, CHART_MIME: event.chart} if event.chart else event.data
        if event.type == "result":
            output = _new_output("execute_result", data=data, metadata=event.metadata,
                                execution_count=execution_count)
        else:
            output = _new_output("display_data", data=data, metadata=event.metadata)
        outputs.append(output)
        if event.display_id:
            displays.setdefault(event.display_id, []).append(output)


def _update(displays: dict[str, list[NotebookNode]], display_id: str, data: dict[str, Any],
            metadata: dict[str, Any]) -> None:
    # Outputs removed by a clear stay in the list; updating them is harmless and invisible.
    for output in displays.get(display_id, []):
        output.data = _from_dict(data)
        output.metadata = _from_dict(metadata)


def _iso(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value
