"""Charts as data: figures in the style of matplotlib's gallery, read back with their values."""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from typing import Any

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from replgate_kernel import charts


@pytest.fixture(autouse=True)
def _box_stats_kept() -> Iterator[None]:
    charts._keep_box_stats()
    yield
    plt.close("all")


def chart(fig: Any) -> dict[str, Any]:
    result = charts.chart_of(fig)
    json.dumps(result, allow_nan=False)  # valid JSON: no NaN, no numpy types
    return result


def test_chart_of_line_plot_gives_points_labels_and_ticks() -> None:
    t = np.arange(0.0, 2.0, 0.5)
    fig, ax = plt.subplots()
    ax.plot(t, 1 + t * 2, label="voltage")
    ax.set(xlabel="time (s)", ylabel="voltage (mV)", title="About as simple as it gets")
    found = chart(fig)
    assert found["type"] == "line"
    assert found["title"] == "About as simple as it gets"
    assert (found["x_label"], found["x_unit"], found["y_unit"]) == ("time (s)", "s", "mV")
    assert found["x_scale"] == found["y_scale"] == "linear"
    assert found["elements"][0]["label"] == "voltage"
    assert [tuple(p) for p in found["elements"][0]["points"]] == [
        (0.0, 1.0), (0.5, 2.0), (1.0, 3.0), (1.5, 4.0)]
    assert len(found["x_ticks"]) == len(found["x_tick_labels"]) > 2


def test_chart_of_several_lines_names_unlabelled_ones() -> None:
    x = np.linspace(0, 2, 5)
    fig, ax = plt.subplots()
    ax.plot(x, x, label="linear")
    ax.plot(x, x**2)
    ax.plot(x, x**3, label="cubic")
    ax.legend()
    found = chart(fig)
    assert [e["label"] for e in found["elements"]] == ["linear", "Line 2", "cubic"]
    assert [tuple(p) for p in found["elements"][1]["points"]][-1] == (2.0, 4.0)


def test_chart_of_log_and_date_axes_gives_their_scales() -> None:
    fig, ax = plt.subplots()
    ax.semilogy([1, 2, 3], [10, 100, 1000])
    assert chart(fig)["y_scale"] == "log"
    fig, ax = plt.subplots()
    days = [datetime.date(2024, 1, d) for d in (1, 2, 3)]
    ax.plot(days, [3, 1, 2])
    found = chart(fig)
    assert found["x_scale"] == "datetime"
    assert found["elements"][0]["points"][0][0].startswith("2024-01-01")
    assert all(tick.startswith("2024-01") for tick in found["x_ticks"])


def test_chart_of_categorical_line_keeps_categories() -> None:
    fig, ax = plt.subplots()
    ax.plot(["apple", "banana", "cherry"], [3, 1, 2])
    found = chart(fig)
    assert found["x_scale"] == "categorical"
    assert found["x_tick_labels"] == ["apple", "banana", "cherry"]
    assert [tuple(p) for p in found["elements"][0]["points"]] == [
        ("apple", 3.0), ("banana", 1.0), ("cherry", 2.0)]


MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]


def test_chart_of_points_at_category_positions_gives_their_names() -> None:
    # a scatter over strings, and a line drawn at the positions the axis gave them (seaborn)
    fig, ax = plt.subplots()
    ax.scatter(MONTHS[:3], [5, 6, 7])
    found = chart(fig)
    assert found["x_scale"] == "categorical"
    assert [tuple(p) for p in found["elements"][0]["points"]] == [
        ("Jan", 5.0), ("Feb", 6.0), ("Mar", 7.0)]
    fig, ax = plt.subplots()
    ax.xaxis.update_units(MONTHS)
    ax.plot(ax.xaxis.convert_units(MONTHS), range(12))
    points = chart(fig)["elements"][0]["points"]
    assert points[0] == ("Jan", 0.0) and points[-1] == ("Dec", 11.0)


def test_chart_of_line_with_ticks_named_by_hand_gives_the_names() -> None:
    fig, ax = plt.subplots()
    ax.plot(range(12), range(12))
    ax.set_xticks(range(12), MONTHS)
    found = chart(fig)
    assert found["x_scale"] == "categorical"
    assert found["x_ticks"] == [float(i) for i in range(12)]
    assert found["elements"][0]["points"][:2] == [("Jan", 0.0), ("Feb", 1.0)]


@pytest.mark.parametrize(("ticks", "labels"), [
    (range(3), ["0", "1", "2"]),             # numbers named as numbers
    ([0, 5, 10], ["start", "mid", "end"]),   # a few landmarks on a numeric axis
])
def test_chart_of_numeric_axis_with_fixed_ticks_stays_numeric(ticks: Any,
                                                              labels: list[str]) -> None:
    fig, ax = plt.subplots()
    ax.plot(range(11), range(11))
    ax.set_xticks(ticks, labels)
    found = chart(fig)
    assert found["x_scale"] == "linear"
    assert found["elements"][0]["points"][0] == (0.0, 0.0)


def test_chart_of_scatter_gives_each_series() -> None:
    rng = np.random.default_rng(19680801)
    fig, ax = plt.subplots()
    for colour in ("tab:blue", "tab:orange"):
        ax.scatter(rng.random(20), rng.random(20), c=colour, label=colour)
    ax.set_title("Scatter plot with a legend")
    found = chart(fig)
    assert found["type"] == "scatter"
    assert [e["label"] for e in found["elements"]] == ["tab:blue", "tab:orange"]
    assert all(len(e["points"]) == 20 for e in found["elements"])
    assert all(0 <= x <= 1 and 0 <= y <= 1 for x, y in found["elements"][0]["points"])


def test_chart_of_scatter_without_label_is_numbered() -> None:
    fig, ax = plt.subplots()
    ax.scatter([1, 2, 3], [4, 5, 6])
    found = chart(fig)
    assert found["elements"][0]["label"] == "Series 1"
    assert [tuple(p) for p in found["elements"][0]["points"]] == [(1, 4), (2, 5), (3, 6)]


def test_chart_of_bar_chart_gives_labels_groups_and_values() -> None:
    fig, ax = plt.subplots()
    ax.bar(["apple", "blueberry", "cherry", "orange"], [40, 100, 30, 55], label="fruit")
    ax.set_ylabel("fruit supply")
    found = chart(fig)
    assert found["type"] == "bar"
    assert found["y_label"] == "fruit supply"
    assert [(e["label"], e["group"], e["value"]) for e in found["elements"]] == [
        ("apple", "fruit", 40), ("blueberry", "fruit", 100), ("cherry", "fruit", 30),
        ("orange", "fruit", 55)]


def test_chart_of_grouped_bars_gives_every_group() -> None:
    species = ("Adelie", "Chinstrap", "Gentoo")
    x = np.arange(len(species))
    fig, ax = plt.subplots()
    ax.bar(x, [38.8, 48.8, 47.5], 0.25, label="Bill Depth")
    ax.bar(x + 0.25, [18.3, 18.4, 14.9], 0.25, label="Bill Length")
    ax.set_xticks(x + 0.125, species)
    found = chart(fig)
    assert {e["group"] for e in found["elements"]} == {"Bill Depth", "Bill Length"}
    assert [e["value"] for e in found["elements"] if e["group"] == "Bill Length"] == [
        18.3, 18.4, 14.9]


def test_chart_of_horizontal_bars_swaps_axes() -> None:
    fig, ax = plt.subplots()
    ax.barh(["Tom", "Dick", "Harry"], [5, 7, 3])
    ax.set_xlabel("Performance")
    found = chart(fig)
    assert found["type"] == "bar"
    assert found["y_label"] == "Performance"  # the value axis, as for vertical bars
    assert [(e["label"], e["value"]) for e in found["elements"]] == [
        ("Tom", 5), ("Dick", 7), ("Harry", 3)]


def test_chart_of_histogram_is_bars_at_bin_centres() -> None:
    fig, ax = plt.subplots()
    ax.hist([1, 1, 2, 3, 3, 3], bins=[0, 2, 4])
    found = chart(fig)
    assert found["type"] == "bar"
    assert [(float(e["label"]), e["value"]) for e in found["elements"]] == [(1, 2), (3, 4)]


def test_chart_of_pie_gives_angles() -> None:
    fig, ax = plt.subplots()
    ax.pie([15, 30, 45, 10], labels=["Frogs", "Hogs", "Dogs", "Logs"])
    ax.set_title("Pie")
    found = chart(fig)
    assert found["type"] == "pie"
    assert found["title"] == "Pie"
    assert [(e["label"], round(e["angle"], 6), e["radius"]) for e in found["elements"]] == [
        ("Frogs", 54.0, 1), ("Hogs", 108.0, 1), ("Dogs", 162.0, 1), ("Logs", 36.0, 1)]


def test_chart_of_donut_gives_its_radius() -> None:
    fig, ax = plt.subplots()
    ax.pie([1, 1], radius=0.7, labels=["a", "b"], wedgeprops={"width": 0.3})
    assert [e["radius"] for e in chart(fig)["elements"]] == [0.7, 0.7]


def test_chart_of_boxplot_gives_quartiles_and_outliers() -> None:
    fig, ax = plt.subplots()
    ax.boxplot([[1, 2, 3, 4, 5, 50], [10, 20, 30]], tick_labels=["low", "high"])
    ax.set_ylabel("value")
    found = chart(fig)
    assert found["type"] == "box_and_whisker"
    low, high = found["elements"]
    assert low["label"] == "low"
    assert (low["min"], low["first_quartile"], low["median"], low["third_quartile"],
            low["max"], low["outliers"]) == (1, 2.25, 3.5, 4.75, 5, [50])
    assert (high["min"], high["median"], high["max"]) == (10, 20, 30)


def test_chart_of_filled_horizontal_boxplot_swaps_axes() -> None:
    fig, ax = plt.subplots()
    ax.boxplot([[1, 2, 3]], orientation="horizontal", patch_artist=True)
    ax.set_xlabel("seconds")
    found = chart(fig)
    assert found["type"] == "box_and_whisker"
    assert found["y_label"] == "seconds"
    assert found["elements"][0]["median"] == 2


def test_chart_of_subplots_is_a_superchart_of_parts() -> None:
    fig, (left, right) = plt.subplots(1, 2)
    left.plot([1, 2, 3])
    right.bar(["a", "b"], [3, 4])
    fig.suptitle("Two views")
    found = chart(fig)
    assert found["type"] == "superchart"
    assert found["title"] == "Two views"
    assert [part["type"] for part in found["elements"]] == ["line", "bar"]


def test_chart_of_image_polar_or_empty_figure_is_unknown() -> None:
    fig, ax = plt.subplots()
    ax.imshow(np.eye(4))
    ax.set_title("heat")
    assert chart(fig) == {"type": "unknown", "title": "heat", "elements": []}
    fig = plt.figure()
    fig.add_subplot(projection="polar").plot([0, 1], [1, 2])
    assert chart(fig)["type"] == "unknown"
    assert chart(plt.figure())["type"] == "unknown"


def test_chart_of_broken_figure_is_unknown_not_an_exception() -> None:
    class Broken:
        def get_axes(self) -> list[Any]:
            raise RuntimeError("user object misbehaves")

    assert charts.chart_of(Broken()) == {"type": "unknown", "title": None, "elements": []}


def test_chart_of_long_line_is_thinned_and_bounded() -> None:
    fig, ax = plt.subplots()
    ax.plot(np.arange(200_000), np.arange(200_000) * 2.0)
    found = chart(fig)
    element = found["elements"][0]
    assert element["truncated"] is True and element["total_points"] == 200_000
    assert len(element["points"]) <= charts.MAX_POINTS
    assert tuple(element["points"][-1]) == (199_999, 399_998)  # the ends are kept
    assert len(json.dumps(found)) <= charts.MAX_BYTES


def test_chart_of_many_series_is_bounded_in_elements_and_bytes() -> None:
    fig, ax = plt.subplots()
    for i in range(150):
        ax.plot(np.arange(1000) + i)
    found = chart(fig)
    assert len(found["elements"]) <= charts.MAX_ELEMENTS
    assert found["truncated"] is True
    assert len(json.dumps(found)) <= charts.MAX_BYTES


def test_chart_of_nan_values_gives_null() -> None:
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [1.0, float("nan"), float("inf")])
    assert [p[1] for p in chart(fig)["elements"][0]["points"]] == [1.0, None, None]
