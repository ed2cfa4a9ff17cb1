"""What the UI shows first, and where (real Chromium, real gateway, real kernels): a chart's
data table folded under its image, a long traceback's end before its beginning, toasts clear
of every control, sessions listed by their metadata's name."""

from __future__ import annotations

from typing import Any

import pytest

from tests.ui.conftest import VIEWPORT, Ui

CONTROLS = ("button, input:not([type=file]), textarea, select, summary, a[href], label.button, "
            "[role=button]")

DEEP_ERROR = ("def level(n):\n"
              "    if n == 8:\n"
              "        raise ValueError('deep failure')\n"
              "    return level(n + 1)\n"
              "\n"
              "level(0)")


async def new_session_page(ui: Ui) -> Any:
    """A signed-in page on a new session of its own."""
    session_id = await ui.create_session()
    page = await ui.signed_in_page()
    await ui.open_session(page, session_id)
    return page


def overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return (a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"]
            and a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"])


async def test_chart_data_table_starts_folded(ui: Ui) -> None:
    page = await new_session_page(ui)
    chart = await ui.run(page, "import matplotlib.pyplot as plt\n"
                               "fig, ax = plt.subplots(figsize=(5, 2.5))\n"
                               "ax.plot(range(60), [i * i for i in range(60)], label='squares')\n"
                               "plt.show()")
    following = await ui.run(page, "print('the next cell')")
    image = chart.locator("img.output-image")
    details = chart.locator("details.chart-data")
    table = details.locator("table.chart-table")
    assert await details.evaluate("node => node.open") is False
    assert await table.is_hidden()
    assert "Chart data" in await details.locator("summary").inner_text()
    # Folded, the chart's cell ends soon after its image, and the next cell follows it.
    image_box = await image.bounding_box()
    chart_box = await chart.bounding_box()
    following_box = await following.bounding_box()
    assert image_box and chart_box and following_box
    assert chart_box["y"] + chart_box["height"] - (image_box["y"] + image_box["height"]) < 100
    assert following_box["y"] < image_box["y"] + image_box["height"] + 120
    await ui.screenshot(page, "ui-chart-folded")

    await details.locator("summary").click()
    await table.wait_for()
    assert await table.locator("tbody tr").count() == 60
    assert await table.locator("tbody tr").nth(2).locator("td").all_inner_texts() == [
        "squares", "2", "4"]


async def test_long_traceback_shows_exception_line_and_last_frames_first(ui: Ui) -> None:
    page = await new_session_page(ui)
    cell = await ui.run(page, DEEP_ERROR)
    assert await cell.get_attribute("data-status") == "error"
    error = cell.locator(".output.error")
    shown = await error.inner_text()  # what a reader sees, in order: folded parts are not in it
    assert "\x1b" not in shown
    exception_at = shown.find("ValueError: deep failure")
    raise_at = shown.find("raise ValueError('deep failure')")
    assert 0 <= exception_at < raise_at, shown
    assert "level(0)" not in shown  # the first frame, folded
    assert "Traceback (most recent call last)" not in shown
    folded = error.locator("details")
    assert await folded.evaluate("node => node.open") is False
    assert "earlier frame" in await folded.locator("summary").inner_text()
    await ui.screenshot(page, "ui-traceback-folded")

    await folded.locator("summary").click()
    whole = await error.inner_text()
    assert whole.find("ValueError: deep failure") < whole.find("level(0)") < whole.rfind(
        "raise ValueError('deep failure')")
    assert "Traceback (most recent call last)" in whole
    assert await error.locator("span[class*='ansi-fg-']").count() > 0

    # A library's error ends in the library: the user's own line that led there stays shown.
    library = await ui.run(page, "import pandas as pd\n"
                                 "frame = pd.DataFrame({'a': [1]})\nframe['price']")
    text = await library.locator(".output.error").inner_text()
    assert 0 <= text.find("KeyError: 'price'") < text.find("frame['price']"), text
    assert "index.pyx" not in text  # pandas' inner frames, folded

    # A short traceback stays whole, as Python prints it.
    short = await ui.run(page, "1 / 0")
    text = await short.locator(".output.error").inner_text()
    assert await short.locator(".output.error details").count() == 0
    assert text.find("----> 1 1 / 0") < text.find("ZeroDivisionError: division by zero")


@pytest.mark.parametrize("viewport", [VIEWPORT, {"width": 700, "height": 820}],
                         ids=["wide", "narrow"])
async def test_upload_toast_covers_no_control(ui: Ui, viewport: dict[str, int]) -> None:
    page = await new_session_page(ui)
    await page.set_viewport_size(viewport)
    await page.set_input_files("#upload-input", files=[
        {"name": "data.csv", "mimeType": "text/csv", "buffer": b"a,b\n1,2\n"}])
    toast = page.locator(".toast", has_text="Uploaded data.csv")
    await toast.wait_for()
    toast_box = await toast.bounding_box()
    assert toast_box
    assert toast_box["x"] >= 0 and toast_box["x"] + toast_box["width"] <= viewport["width"]
    assert toast_box["y"] >= 0 and toast_box["y"] + toast_box["height"] <= viewport["height"]
    run_box = await page.locator("#run").bounding_box()
    assert run_box and not overlap(toast_box, run_box), (toast_box, run_box)
    covered = []
    for control in await page.locator(CONTROLS).all():
        box = await control.bounding_box() if await control.is_visible() else None
        if box and overlap(toast_box, box):
            covered.append(await control.evaluate("node => node.outerHTML.slice(0, 120)"))
    assert not covered, covered
    await ui.screenshot(page, f"ui-toast-{viewport['width']}")


async def test_session_list_shows_metadata_name(ui: Ui) -> None:
    answer = await ui.api("POST", "/v1/sessions", json={
        "metadata": {"name": "Q3 <b>sales</b> report", "owner": "agent-7"}})
    assert answer.status_code == 201, answer.text
    named = answer.json()["id"]
    ui.created.append(named)
    unnamed = await ui.create_session()
    page = await ui.signed_in_page()

    item = page.locator(f".session-item[data-session-id='{named}']")
    lines = (await item.inner_text()).splitlines()
    assert lines[0] == "Q3 <b>sales</b> report"  # the name as text, never as markup
    assert f"{named[:8]} · owner: agent-7" in lines  # its id's prefix, the rest of its metadata
    assert await item.locator("b").count() == 0
    plain = page.locator(f".session-item[data-session-id='{unnamed}']")
    assert (await plain.inner_text()).splitlines()[0] == unnamed[:8]

    await item.click()
    await page.wait_for_selector("#live[data-state=live]")
    assert await page.locator("#session-title").inner_text() == "Q3 <b>sales</b> report"
    assert await page.locator("#session-title").get_attribute("title") == named
    await ui.screenshot(page, "ui-session-names")
