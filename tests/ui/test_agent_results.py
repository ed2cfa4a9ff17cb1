"""The web UI shows what agents read: a cell's touched files as links, a chart's data as a
table under its image (real Chromium, real gateway, real kernels)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.ui.conftest import Ui


async def new_session_page(ui: Ui) -> Any:
    """A signed-in page on a new session of its own."""
    session_id = await ui.create_session()
    page = await ui.signed_in_page()
    await ui.open_session(page, session_id)
    return page


async def test_cell_lists_touched_files_as_download_links(ui: Ui, tmp_path: Path) -> None:
    session_id = await ui.create_session()
    await ui.api("PUT", f"/v1/sessions/{session_id}/files/old.txt", content=b"bye")
    page = await ui.signed_in_page()
    await ui.open_session(page, session_id)
    cell = await ui.run(page, "import os\nos.makedirs('out', exist_ok=True)\n"
                              "open('out/report.txt', 'w').write('the report')\n"
                              "os.remove('old.txt')")
    touched = cell.locator(".touched")
    link = touched.locator("button.touched-link[data-path='out/report.txt']")
    assert await link.inner_text() == "out/report.txt"
    assert "created" in await touched.locator(".touched-file.created").inner_text()
    deleted = touched.locator(".touched-file.deleted")
    assert "old.txt" in await deleted.inner_text()
    assert await deleted.locator("button").count() == 0  # a deleted file is not a link
    async with page.expect_download() as download_info:
        await link.click()
    download = await download_info.value
    await download.save_as(tmp_path / "report.txt")
    assert (tmp_path / "report.txt").read_text() == "the report"
    await ui.screenshot(page, "ui-touched-files")


async def test_chart_data_shows_as_table_under_image(ui: Ui) -> None:
    page = await new_session_page(ui)
    cell = await ui.run(page, "import matplotlib.pyplot as plt\n"
                              "fig, ax = plt.subplots(figsize=(4, 3))\n"
                              "ax.bar(['north', 'south', 'east'], [12, 7.5, 3], label='sales')\n"
                              "ax.set_ylabel('units')\nax.set_title('Sales')\nplt.show()")
    output = cell.locator(".output.rich")
    await output.locator("img.output-image").wait_for()
    await output.locator(".chart-data summary").click()  # folded until asked for
    table = output.locator(".chart-data table.chart-table")
    assert await table.locator("thead th").all_inner_texts() == ["label", "group", "units"]
    rows = [await row.locator("td").all_inner_texts()
            for row in await table.locator("tbody tr").all()]
    assert rows == [["north", "sales", "12"], ["south", "sales", "7.5"], ["east", "sales", "3"]]
    assert "bar: Sales" in await output.locator(".chart-data summary").inner_text()
    image_box = await output.locator("img.output-image").bounding_box()
    table_box = await table.bounding_box()
    assert image_box and table_box and table_box["y"] >= image_box["y"] + image_box["height"]
    await ui.screenshot(page, "ui-chart-data")


async def test_chart_of_subplots_shows_a_table_per_part(ui: Ui) -> None:
    page = await new_session_page(ui)
    cell = await ui.run(page, "import matplotlib.pyplot as plt\n"
                              "fig, (a, b) = plt.subplots(1, 2, figsize=(6, 3))\n"
                              "a.plot([0, 1], [2, 3], label='rise')\n"
                              "b.pie([1, 3], labels=['x', 'y'])\nplt.show()")
    await cell.locator(".chart-data > summary").first.click()  # opens its parts too
    tables = cell.locator(".chart-data table.chart-table")
    await tables.first.wait_for()
    await tables.nth(1).wait_for()
    assert await tables.count() == 2
    assert ["rise", "0", "2"] in [await row.locator("td").all_inner_texts()
                                  for row in await tables.nth(0).locator("tbody tr").all()]
    assert await tables.nth(1).locator("tbody tr").first.locator("td").all_inner_texts() == [
        "x", "90", "25.0%"]
