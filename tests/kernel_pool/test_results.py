"""What agents read, end to end through a real kernel: charts, files touched, plain tracebacks."""

from __future__ import annotations

import pytest
from kp_support import run_ok

from kernel_pool import Session


async def test_execute_gives_chart_beside_png(shared_session: Session) -> None:
    result = await shared_session.execute(
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots()\n"
        "ax.bar(['north', 'south'], [12.5, 7], label='sales')\n"
        "ax.set_title('Sales by region')\n"
        "plt.show()")
    assert result.status == "ok", result.error
    (figure,) = [o for o in result.outputs if "image/png" in o.data]
    assert figure.chart is not None
    assert "application/vnd.replgate.chart+json" not in figure.data
    assert figure.chart["type"] == "bar"
    assert figure.chart["title"] == "Sales by region"
    assert [(e["label"], e["group"], e["value"]) for e in figure.chart["elements"]] == [
        ("north", "sales", 12.5), ("south", "sales", 7)]


async def test_execute_gives_chart_of_a_boxplot_and_of_a_figure_result(
        shared_session: Session) -> None:
    result = await shared_session.execute(
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots()\n"
        "ax.boxplot([[1, 2, 3, 4, 100]])\n"
        "plt.close(fig)\n"
        "fig")
    assert result.status == "ok", result.error
    (box,) = [o.chart for o in result.outputs if o.chart is not None]
    assert box["type"] == "box_and_whisker"
    assert box["elements"][0]["outliers"] == [100]


async def test_execute_gives_line_charts_over_months_with_the_months_as_x(
        shared_session: Session) -> None:
    # pandas draws a non-numeric index at 0..11 and names every other tick; seaborn draws at
    # the positions of matplotlib's category units
    result = await shared_session.execute(
        "import calendar, matplotlib.pyplot as plt, pandas as pd, seaborn as sns\n"
        "df = pd.DataFrame({'month': list(calendar.month_abbr)[1:], 'sales': range(12)})\n"
        "df.plot(x='month', y='sales')\n"
        "plt.show()\n"
        "sns.lineplot(data=df, x='month', y='sales')\n"
        "plt.show()")
    assert result.status == "ok", result.error
    charts = [o.chart for o in result.outputs if o.chart is not None]
    assert len(charts) == 2
    for chart in charts:
        assert (chart["type"], chart["x_scale"]) == ("line", "categorical")
        points = [tuple(p) for p in chart["elements"][0]["points"]]
        assert points[:3] == [("Jan", 0.0), ("Feb", 1.0), ("Mar", 2.0)]
        assert points[-1] == ("Dec", 11.0)


async def test_execute_reports_files_created_modified_and_deleted(session: Session) -> None:
    await run_ok(session, "open('edit.txt', 'w').write('one'); open('gone.txt', 'w').write('x')")
    result = await session.execute(
        "import os, pathlib\n"
        "pathlib.Path('out/tables').mkdir(parents=True)\n"
        "pathlib.Path('out/tables/t.csv').write_text('a,b\\n')\n"
        "open('edit.txt', 'a').write('two')\n"
        "os.remove('gone.txt')\n"
        "open('tmp', 'w').close(); os.remove('tmp')\n"
        "print(open('edit.txt').read())")
    assert result.status == "ok", result.error
    assert [(f.path, f.change, f.size) for f in result.files] == [
        ("edit.txt", "modified", 6), ("gone.txt", "deleted", None),
        ("out/tables/t.csv", "created", 4)]
    assert result.truncated is False
    assert (await session.execute("x = 1")).files == []


async def test_execute_gives_files_of_a_failing_cell(session: Session) -> None:
    result = await session.execute("open('half.txt', 'w').write('x')\n1 / 0")
    assert result.status == "error"
    assert [(f.path, f.change) for f in result.files] == [("half.txt", "created")]


@pytest.mark.parametrize("code", ["1 / 0", "import nosuchmodule", "def f(:\n  pass",
                                  "raise ValueError('\\x1b[31mred\\x1b[0m')"])
async def test_execute_gives_traceback_as_plain_text(shared_session: Session, code: str) -> None:
    result = await shared_session.execute(code)
    assert result.error is not None
    assert any("\x1b[" in line for line in result.error.traceback_lines)  # Jupyter's, coloured
    assert "\x1b" not in result.error.text
    assert result.error.ename in result.error.text
