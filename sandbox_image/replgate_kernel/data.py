"""Values as data in a result's bundle, as E2B's sandbox gives them (its template's
``0002_data.py``), so that E2B's ``Result.data`` and ``Result.json`` are filled.

- A pandas DataFrame also carries its columns, ``{"a": [1, 2, 3]}``, under :data:`MIME`
  (timestamps as ISO 8601 strings), as does any object with a ``_repr_e2b_data_`` method.
- A list or a dict also carries itself under :data:`VALUE_MIME` when it is plain JSON data
  (numpy arrays and numbers as their values): E2B's kernel gives it as ``application/json``,
  which Jupyter's front ends (and replgate's UI) would then show instead of its text.

Neither is the text shown: a frame's and a list's text are cut to a screenful, these are not.
So that the added value never makes a bundle too big to send (the kernel then replaces the
whole bundle with a notice, see :mod:`replgate_kernel.outputs`), one larger than a quarter of
the per-output cap is left out; a frame whose shape and types say so is not even read. Values
JSON cannot hold become ``null`` (NaN, NaT, pandas' NA) or their text (anything else).
"""

from __future__ import annotations

import datetime
import json
import math
import sys
from typing import Any

MIME = "application/vnd.replgate.data+json"
"""The MIME type of a frame's columns (a ``+json`` type: a notebook keeps it as JSON). The
gateway's E2B face gives it as ``Result.data``."""
VALUE_MIME = "application/vnd.replgate.value+json"
"""The MIME type of a list's or dict's value; the E2B face gives it as ``Result.json``."""


def install(shell: Any, max_output_bytes: int) -> None:
    """Add both representations to the shell's display formatter."""
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    budget = max(1, max_output_bytes // 4)

    class DataFormatter(BaseFormatter):  # type: ignore[misc]
        format_type = Unicode(MIME)
        _return_type = dict
        print_method = ObjectName("_repr_e2b_data_")

    class ValueFormatter(BaseFormatter):  # type: ignore[misc]
        format_type = Unicode(VALUE_MIME)
        _return_type = (list, dict)
        print_method = ObjectName("_repr_replgate_value_")

    formatters = shell.display_formatter.formatters
    data = DataFormatter(parent=shell.display_formatter)
    # By name: pandas is not imported for it (a frame exists only once user code did).
    data.for_type_by_name("pandas.core.frame", "DataFrame",
                          lambda frame: frame_columns(frame, budget))
    formatters[MIME] = data
    value = ValueFormatter(parent=shell.display_formatter)
    for kind in (list, dict):  # and their subclasses
        value.for_type(kind, lambda obj: as_json(obj, budget))
    formatters[VALUE_MIME] = value


def frame_columns(frame: Any, budget: int) -> dict[str, list[Any]] | None:
    """The frame as ``{column: [values]}``, or None when it would take over ``budget`` bytes
    (judged from its shape and types before anything is read; measured when it holds objects,
    whose text has no bound)."""
    numpy = sys.modules["numpy"]
    kinds = [dtype.kind if isinstance(dtype, numpy.dtype) else "O" for dtype in frame.dtypes]
    rows = frame.shape[0] + 1  # (and the column's name, about)
    if sum(rows * MAX_CELL_BYTES.get(kind, OBJECT_CELL_BYTES) for kind in kinds) > budget:
        return None
    pandas = sys.modules["pandas"]
    columns: dict[str, list[Any]] = {}
    for position, (name, kind) in enumerate(zip(frame.columns, kinds, strict=True)):
        series = frame.iloc[:, position]
        values = series.tolist()  # numpy's own conversion, to Python ints, floats and bools
        if kind == "f":
            if not numpy.isfinite(series.to_numpy()).all():
                values = [v if math.isfinite(v) else None for v in values]
        elif kind not in "biu":
            values = [_value(v, pandas) for v in values]
        columns[_key(name)] = values
    if all(kind in MAX_CELL_BYTES for kind in kinds):
        return columns  # within the budget for sure: no need to measure
    return columns if _fits(columns, budget) else None


MAX_CELL_BYTES = {"b": 7, "i": 22, "u": 22, "f": 26, "M": 40, "m": 40}
"""The longest a cell of numpy's dtype kind takes in JSON, with its separator (a float's
shortest repr, an int64's 20 digits and sign, an ISO timestamp with its offset, a
Timedelta's text)."""
OBJECT_CELL_BYTES = 10
"""What an object cell takes, about (a frame of them is measured once converted)."""


def as_json(obj: list[Any] | dict[Any, Any], budget: int) -> Any:
    """``obj`` as JSON data, or None when it is not plain data or takes over ``budget`` bytes."""
    if len(obj) * 3 > budget:  # each item takes 3 bytes at least ("0, ")
        return None
    try:
        text = json.dumps(obj, default=_numpy, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None
    return json.loads(text) if len(text) <= budget else None


def _numpy(value: Any) -> Any:
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        if isinstance(value, numpy.ndarray):
            return value.tolist()
        if isinstance(value, numpy.generic):
            return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON data")


def _key(name: Any) -> str:
    return name if isinstance(name, str) else str(name)


def _value(value: Any, pandas: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is pandas.NaT:
        return None
    if isinstance(value, datetime.date | datetime.time):  # pandas' Timestamp among them
        return value.isoformat()
    try:
        if pandas.isna(value):
            return None
    except (TypeError, ValueError):  # an array-like value: its text
        pass
    item = getattr(value, "item", None)  # a numpy number in an object column
    if callable(item) and type(value).__module__ == "numpy":
        return _value(item(), pandas)
    return str(value)


def _fits(columns: dict[str, list[Any]], budget: int) -> bool:
    try:
        return len(json.dumps(columns, allow_nan=False)) <= budget
    except (TypeError, ValueError):
        return False
