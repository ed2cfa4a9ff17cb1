"""Charts as data: a matplotlib figure described in E2B's chart format, inside the sandbox.

The kernel shows a figure as ``image/png``; this adds, in the same display bundle, what an agent
needs to read the numbers: the chart's ``type`` (line, scatter, bar, pie, box_and_whisker,
superchart for several axes, or unknown), its title, axis labels, units, scales and ticks, and
each plotted element's values. The shape is E2B's (``e2b_code_interpreter.charts``), so an E2B
client reads it unchanged.

It runs on user objects in user code's process: it never raises (anything it cannot read makes
an ``unknown`` chart), and its output is bounded (elements per chart, points per element, parts
of a superchart, bytes in all), thinned evenly rather than cut, with ``truncated`` set.
Box plots are read from the statistics matplotlib drew them with (``Axes.bxp`` is wrapped to
keep them on the axes), not guessed back from lines.

On a categorical axis a point's value is its category's name, as E2B gives it (``("Mar", 6.0)``,
not ``(2.0, 6.0)``; the ticks stay positions): matplotlib's category units name the positions
of strings plotted as such (and of seaborn's plots); pandas' line plots of a non-numeric index
(months as the index or as ``x=``), which draw at 0..n-1 and name only some ticks, keep their
index on the axis (``LinePlot._post_plot_logic`` is wrapped to leave it there); and ticks at
0..n-1 each named by hand name those positions, as E2B's scale detection reads them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

MIME = "application/vnd.replgate.chart+json"
MAX_ELEMENTS = 100
"""Elements (lines, series, bars, wedges, boxes) kept per chart."""
MAX_POINTS = 1000
"""Points kept per line or scatter series; longer ones are thinned evenly."""
MAX_PARTS = 16
"""Charts kept in a superchart (one per axes)."""
MAX_BYTES = 256 * 1024
"""JSON size of a whole chart; a bigger one is thinned, then given up as ``unknown``."""
MAX_TICKS = 50
MAX_TEXT = 200
"""Characters kept of a title, label or tick label."""

_UNIT = re.compile(r"\s\((.*?)\)|\[(.*?)\]")
_BOXES_ATTR = "_replgate_boxes"
_CATEGORIES_ATTR = "_replgate_categories"


def chart_of(figure: Any) -> dict[str, Any]:
    """The figure as an E2B chart dict; ``{"type": "unknown", ...}`` when it cannot be read."""
    try:
        chart = _figure(figure, MAX_POINTS)
        points = MAX_POINTS
        while _size(chart) > MAX_BYTES and points > 10:
            points //= 4
            chart = _figure(figure, points)
            chart["truncated"] = True
        if _size(chart) > MAX_BYTES:
            return _unknown(chart.get("title"))
        return chart
    except Exception:  # a user's figure may hold anything: describe it as unknown instead
        return _unknown(None)


def install(shell: Any) -> None:
    """Add the chart to every matplotlib figure's display bundle, and keep box statistics."""
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    class ChartFormatter(BaseFormatter):  # type: ignore[misc]
        format_type = Unicode(MIME)
        _return_type = dict
        print_method = ObjectName("_repr_replgate_chart_")

    formatter = ChartFormatter(parent=shell.display_formatter)
    formatter.for_type_by_name("matplotlib.figure", "Figure", chart_of)
    shell.display_formatter.formatters[MIME] = formatter
    _keep_box_stats()
    _keep_pandas_categories()


def _keep_box_stats() -> None:
    from matplotlib.axes import Axes

    draw = Axes.bxp
    if getattr(draw, "_replgate", False):
        return

    def bxp(self: Any, bxpstats: Any, *args: Any, **kwargs: Any) -> Any:
        drawn = draw(self, bxpstats, *args, **kwargs)
        try:
            # ``orientation`` since matplotlib 3.10, ``vert`` before (None when not given)
            horizontal = (kwargs.get("orientation") == "horizontal"
                          or kwargs.get("vert") is False)
            kept = getattr(self, _BOXES_ATTR, [])
            kept.append((horizontal, list(bxpstats)))
            setattr(self, _BOXES_ATTR, kept)
        except Exception:  # only the chart loses its boxes; the drawing stands
            pass
        return drawn

    bxp._replgate = True  # type: ignore[attr-defined]
    Axes.bxp = bxp


def _keep_pandas_categories() -> None:
    """Leave a pandas line plot's non-numeric index on its x axis (see the module docstring)."""
    try:
        from pandas.plotting._matplotlib.core import LinePlot
    except Exception:  # no pandas, or another layout of its private modules: no names kept
        return
    post_plot = LinePlot._post_plot_logic
    if getattr(post_plot, "_replgate", False):
        return

    def post_plot_logic(self: Any, ax: Any, data: Any) -> Any:
        done = post_plot(self, ax, data)
        try:
            if getattr(self, "_need_to_set_index", False):  # drawn at 0..n-1, ticks named
                setattr(ax.xaxis, _CATEGORIES_ATTR, data.index)
        except Exception:  # only the chart loses the names; the plot stands
            pass
        return done

    post_plot_logic._replgate = True  # type: ignore[attr-defined]
    LinePlot._post_plot_logic = post_plot_logic


# -- figure and axes ----------------------------------------------------------------------------


def _figure(figure: Any, points: int) -> dict[str, Any]:
    axes = [ax for ax in figure.get_axes() if ax.get_visible() and not _is_colorbar(ax)]
    if len(axes) == 1:
        return _axes(axes[0], points)
    suptitle = getattr(figure, "_suptitle", None)
    title = _text(suptitle.get_text()) if suptitle is not None else None
    if not axes:
        return _unknown(title)
    parts = [_axes(ax, points) for ax in axes[:MAX_PARTS]]
    chart: dict[str, Any] = {"type": "superchart", "title": title or None, "elements": parts}
    if len(axes) > MAX_PARTS:
        chart["truncated"] = True
    return chart


def _is_colorbar(ax: Any) -> bool:
    return getattr(ax, "_colorbar", None) is not None or ax.get_label() == "<colorbar>"


def _axes(ax: Any, points: int) -> dict[str, Any]:
    title = _text(ax.get_title()) or None
    if getattr(ax, "name", "") != "rectilinear" or ax.images:
        return _unknown(title)
    boxes = getattr(ax, _BOXES_ATTR, None)
    if boxes:
        return _box_chart(ax, boxes)
    lines = [line for line in ax.get_lines() if line.get_visible()]
    collections = [c for c in ax.collections if c.get_visible()]
    patches = [p for p in ax.patches if p.get_visible()]
    bars = [c for c in ax.containers if type(c).__name__ == "BarContainer"]
    kinds = {type(c).__name__ for c in collections}
    if patches and all(type(p).__name__ == "Wedge" for p in patches) and not lines:
        return _pie_chart(ax, patches)
    if bars and not lines and not collections:
        return _bar_chart(ax, bars)
    if lines and not patches and kinds <= {"PolyCollection", "FillBetweenPolyCollection"}:
        # a confidence band drawn under the lines (seaborn's lineplot) is not a series
        return _point_chart(ax, "line", _line_elements(lines, points))
    if collections and not lines and not patches and kinds == {"PathCollection"}:
        return _point_chart(ax, "scatter", _scatter_elements(collections, points))
    return _unknown(title)


def _unknown(title: Any) -> dict[str, Any]:
    return {"type": "unknown", "title": title or None, "elements": []}


def _base(ax: Any, kind: str) -> dict[str, Any]:
    chart: dict[str, Any] = {"type": kind, "title": _text(ax.get_title()) or None}
    for axis in ("x", "y"):
        label = _text(getattr(ax, f"get_{axis}label")()) or None
        chart[f"{axis}_label"] = label
        match = _UNIT.search(label or "")
        chart[f"{axis}_unit"] = (match.group(1) or match.group(2)) if match else None
    return chart


def _swap_axes(chart: dict[str, Any]) -> None:
    """Horizontal bars and boxes: the value axis is y in E2B's shape, as for vertical ones."""
    for key in ("label", "unit"):
        chart[f"x_{key}"], chart[f"y_{key}"] = chart[f"y_{key}"], chart[f"x_{key}"]


# -- point charts -------------------------------------------------------------------------------


def _point_chart(ax: Any, kind: str, elements: list[dict[str, Any]]) -> dict[str, Any]:
    chart = _base(ax, kind)
    for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
        ticks, labels = _ticks(axis, getattr(ax, f"get_{name}lim")())
        chart[f"{name}_ticks"] = [_value(axis, _round(tick)) for tick in ticks]
        chart[f"{name}_tick_labels"] = labels
        chart[f"{name}_scale"] = _scale(axis, getattr(ax, f"get_{name}scale")())
    return _with_elements(chart, elements)


def _with_elements(chart: dict[str, Any], elements: list[dict[str, Any]]) -> dict[str, Any]:
    chart["elements"] = elements[:MAX_ELEMENTS]
    if len(elements) > MAX_ELEMENTS:
        chart["truncated"] = True
    return chart


def _line_elements(lines: list[Any], points: int) -> list[dict[str, Any]]:
    elements = []
    for number, line in enumerate(lines, 1):
        xs, ys = list(line.get_xdata()), list(line.get_ydata())
        read_x, read_y = _reader(line.axes.xaxis), _reader(line.axes.yaxis)
        kept = _thin(list(zip(xs, ys, strict=False)), points)
        pairs = [(read_x(x), read_y(y)) for x, y in kept]
        elements.append({"label": _series_label(line.get_label(), "Line", number),
                         "points": pairs, **_thinned(len(xs), points)})
    return elements


def _scatter_elements(collections: list[Any], points: int) -> list[dict[str, Any]]:
    elements = []
    for number, collection in enumerate(collections, 1):
        offsets = [tuple(row) for row in collection.get_offsets()]
        read_x, read_y = _reader(collection.axes.xaxis), _reader(collection.axes.yaxis)
        pairs = [(read_x(x), read_y(y)) for x, y in _thin(offsets, points)]
        elements.append({"label": _series_label(collection.get_label(), "Series", number),
                         "points": pairs, **_thinned(len(offsets), points)})
    return elements


def _thin(items: list[Any], limit: int) -> list[Any]:
    if len(items) <= limit:
        return items
    step = (len(items) - 1) / (limit - 1)
    return [items[round(i * step)] for i in range(limit)]


def _thinned(count: int, limit: int) -> dict[str, Any]:
    return {"truncated": True, "total_points": count} if count > limit else {}


def _series_label(label: Any, kind: str, number: int) -> str:
    text = _text(label)
    return f"{kind} {number}" if not text or text.startswith("_") else text


# -- bars, pies, boxes --------------------------------------------------------------------------


def _bar_chart(ax: Any, containers: list[Any]) -> dict[str, Any]:
    chart = _base(ax, "bar")
    elements: list[dict[str, Any]] = []
    horizontal = False
    for number, container in enumerate(containers, 1):
        horizontal = getattr(container, "orientation", "vertical") == "horizontal"
        axis = ax.yaxis if horizontal else ax.xaxis
        labels = _tick_label_map(axis, ax.get_ylim() if horizontal else ax.get_xlim())
        group = _series_label(container.get_label(), "Group", number)
        for rect in container.patches:
            if horizontal:
                center, value = rect.get_y() + rect.get_height() / 2, rect.get_width()
            else:
                center, value = rect.get_x() + rect.get_width() / 2, rect.get_height()
            elements.append({"label": _label_at(labels, center), "group": group,
                             "value": _number(value)})
    if horizontal:
        _swap_axes(chart)
    return _with_elements(chart, elements)


def _pie_chart(ax: Any, wedges: list[Any]) -> dict[str, Any]:
    elements = [{"label": _series_label(w.get_label(), "Slice", number),
                 "angle": _number(abs(w.theta2 - w.theta1)), "radius": _number(w.r)}
                for number, w in enumerate(wedges[:MAX_ELEMENTS + 1], 1)]
    return _with_elements({"type": "pie", "title": _text(ax.get_title()) or None}, elements)


def _box_chart(ax: Any, drawn: list[tuple[bool, list[dict[str, Any]]]]) -> dict[str, Any]:
    chart = _base(ax, "box_and_whisker")
    elements = []
    horizontal = drawn[-1][0]
    for _horizontal, stats in drawn:
        for number, box in enumerate(stats, 1):
            fliers = [_number(v) for v in list(box.get("fliers", []))[:MAX_POINTS]]
            elements.append({
                "label": _series_label(box.get("label"), "Box", number),
                "min": _number(box.get("whislo")), "first_quartile": _number(box.get("q1")),
                "median": _number(box.get("med")), "third_quartile": _number(box.get("q3")),
                "max": _number(box.get("whishi")), "outliers": fliers})
    if horizontal:
        _swap_axes(chart)
    return _with_elements(chart, elements)


# -- axes: ticks, scales, values ----------------------------------------------------------------


def _ticks(axis: Any, limits: tuple[float, float]) -> tuple[list[float], list[str]]:
    """The major ticks inside the view and their labels, as drawn (no draw needed)."""
    low, high = sorted(limits)
    locations = [float(t) for t in axis.get_majorticklocs()
                 if low - 1e-9 * abs(high - low) <= t <= high + 1e-9 * abs(high - low)]
    locations = locations[:MAX_TICKS]
    formatter = axis.get_major_formatter()
    try:
        labels = [_text(label) for label in formatter.format_ticks(locations)]
    except Exception:
        labels = [f"{t:g}" for t in locations]
    return locations, [label.replace("\u2212", "-") for label in labels]


def _tick_label_map(axis: Any, limits: tuple[float, float]) -> dict[float, str]:
    ticks, labels = _ticks(axis, limits)
    return dict(zip(ticks, labels, strict=False))


def _label_at(labels: dict[float, str], position: float) -> str:
    for tick, label in labels.items():
        if abs(tick - position) < 1e-6 and label:
            return label
    return f"{position:g}"


def _scale(axis: Any, scale: str) -> str:
    kind = _converter_kind(axis)
    if kind in ("datetime", "categorical"):
        return kind
    if scale != "linear":
        return scale if scale in ("log", "symlog", "logit", "function", "functionlog",
                                  "asinh") else "unknown"
    return "categorical" if _named_ticks(axis) is not None else "linear"


def _converter_kind(axis: Any) -> str:
    if getattr(axis, _CATEGORIES_ATTR, None) is not None:
        return "categorical"
    converter = axis.get_converter() if hasattr(axis, "get_converter") else axis.converter
    name = type(converter).__name__ if converter is not None else ""
    if "Date" in name:
        return "datetime"
    if "Category" in name:
        return "categorical"
    return ""


def _reader(axis: Any) -> Callable[[Any], Any]:
    """How a data value on ``axis`` reads: as :func:`_value`, and a category's position on a
    categorical axis as the category's name."""
    name_at = _category_names(axis)
    if name_at is None:
        return lambda value: _value(axis, value)

    def read(value: Any) -> Any:
        number = None if isinstance(value, str) else _number(value)
        if number is not None and number.is_integer():
            name = name_at(int(number))
            if name is not None:
                return name
        return _value(axis, value)

    return read


def _category_names(axis: Any) -> Callable[[int], str | None] | None:
    """The name of the category at each position of a categorical axis; None for another."""
    index = getattr(axis, _CATEGORIES_ATTR, None)
    if index is not None:  # a pandas plot's index, drawn at 0..n-1
        size = len(index)
        return lambda position: _text(index[position]) if 0 <= position < size else None
    if _converter_kind(axis) != "categorical":
        return _named_ticks(axis)
    mapping = getattr(getattr(axis, "units", None), "_mapping", None)  # matplotlib's UnitData
    if not isinstance(mapping, dict):
        return None
    names = {int(position): _text(name) for name, position in mapping.items()}
    return names.get


def _named_ticks(axis: Any) -> Callable[[int], str | None] | None:
    """Ticks at 0..n-1 each named by hand (``plt.xticks(range(12), months)``): categories, as
    E2B reads them; None for any other axis."""
    if type(axis.get_major_locator()).__name__ != "FixedLocator":  # ticks placed by hand
        return None
    ticks, labels = _ticks(axis, axis.get_view_interval())
    if len(ticks) < 2 or ticks != [float(i) for i in range(len(ticks))]:
        return None
    if any(not label or label == str(i) for i, label in enumerate(labels)):
        return None
    return dict(enumerate(labels)).get


def _value(axis: Any, value: Any) -> Any:
    """A data value as JSON: numbers as floats (NaN and infinity as null), dates as ISO text."""
    if isinstance(value, str):
        return _text(value)
    if type(value).__name__ == "datetime64":
        return str(value.astype("datetime64[s]"))
    if hasattr(value, "isoformat"):
        return value.isoformat()
    number = _number(value)
    if number is not None and _converter_kind(axis) == "datetime":
        from matplotlib.dates import num2date

        return num2date(number).isoformat()
    return number


def _round(tick: float) -> float:
    """A tick as it was meant (0.6, not 0.6000000000000001): tick steps add float error."""
    return float(f"{tick:.12g}")


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _text(value: Any) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "..."


def _size(chart: dict[str, Any]) -> int:
    return len(json.dumps(chart))
