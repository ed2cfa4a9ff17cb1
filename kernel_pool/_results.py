"""What an agent reads beside the raw outputs, taken from the kernel's messages and checked.

- A chart: the sandbox adds it to a matplotlib figure's display bundle under :data:`CHART_MIME`
  (see ``sandbox_image/replgate_kernel/charts.py``); it becomes the output's ``chart``.
- The files an execution touched: the sandbox lists them in the ``execute_reply``'s metadata
  (``sandbox_image/replgate_kernel/files.py``); they become ``files`` on ``done``.

The kernel is untrusted: each is validated and bounded here, and anything malformed is dropped
rather than passed on.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from kernel_pool.events import CHART_MIME, FileChange

FILES_KEY = "replgate_files"
MAX_FILES = 1000
"""File changes kept per execution (the sandbox sends at most as many)."""
MAX_PATH = 4096


def split_chart(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The bundle without its chart, and the chart (None when absent or not an object)."""
    if CHART_MIME not in data:
        return data, None
    rest = {mime: value for mime, value in data.items() if mime != CHART_MIME}
    chart = data[CHART_MIME]
    return rest, chart if isinstance(chart, dict) and isinstance(chart.get("type"), str) else None


class _Reported(BaseModel):
    files: list[Any] = []
    truncated: bool = False


def files_from_reply(metadata: Any) -> tuple[list[FileChange], bool]:
    """The files listed in an execute_reply's metadata, and whether the list was cut."""
    if not isinstance(metadata, dict) or FILES_KEY not in metadata:
        return [], False
    try:
        reported = _Reported.model_validate(metadata[FILES_KEY])
    except ValidationError:
        return [], True
    changes: list[FileChange] = []
    cut = reported.truncated or len(reported.files) > MAX_FILES
    for item in reported.files[:MAX_FILES]:
        try:
            change = FileChange.model_validate(item)
        except ValidationError:
            cut = True
            continue
        parts = change.path.split("/")
        if len(change.path) > MAX_PATH or change.path.startswith("/") or ".." in parts:
            cut = True
            continue
        changes.append(change)
    return changes, cut
