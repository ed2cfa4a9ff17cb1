"""The web UI in a real headless Chromium, against a real gateway and real sandboxed kernels.

Screenshots land in tests/artifacts/. Set REPLGATE_UPDATE_DOCS_SCREENSHOT=1 to also refresh
docs/ui.png (the README's picture) from the transcript test.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import struct
import time
from pathlib import Path

import httpx

from tests.conftest import REPO
from tests.ui.conftest import Ui

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_SIGNATURE, data[:16]
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


async def test_get_page_answers_without_auth(ui: Ui) -> None:
    async with httpx.AsyncClient(base_url=ui.gateway.url) as anonymous:
        page = await anonymous.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "script-src 'self' 'nonce-" in csp and "frame-ancestors 'none'" in csp
        assert "{{nonce}}" not in page.text
        # app.js and the modules it imports, each served (the browser fetches them by name).
        modules = [(path.name, "javascript") for path in (REPO / "gateway" / "static").glob("*.js")]
        for name, kind in (*modules, ("app.css", "css"), ("favicon.svg", "svg")):
            asset = await anonymous.get(f"/ui/{name}")
            assert asset.status_code == 200 and kind in asset.headers["content-type"]
        assert (await anonymous.get("/ui/..%2Fservice.py")).status_code == 404
        missing = await anonymous.get("/ui/nothing.js")
        assert missing.status_code == 404 and missing.json()["detail"]


async def test_sign_in_refuses_wrong_key(ui: Ui) -> None:
    page = await ui.new_page()
    await page.goto(ui.gateway.url + "/")
    await page.fill("#key-input", "rg_not_a_key")
    await page.click("#signin-form button[type=submit]")
    await page.wait_for_selector("#signin-error:has-text('refused')")
    await ui.screenshot(page, "ui-sign-in")
    assert await page.locator("#app").is_hidden()
    assert await page.evaluate("localStorage.getItem('replgate.apiKey')") is None


async def test_run_cell_shows_text_and_png(ui: Ui) -> None:
    page = await ui.signed_in_page()
    before = await ui.session_ids()
    await page.click("#new-session")
    await page.wait_for_selector("#live[data-state=live]")
    session_id = (await page.evaluate("location.hash")).removeprefix("#/s/")
    ui.created.append(session_id)
    assert await ui.session_ids() == before | {session_id}
    item = page.locator(f".session-item[data-session-id='{session_id}']")
    await item.and_(page.locator(".active")).wait_for()

    cell = await ui.run(page, "import matplotlib.pyplot as plt\n"
                              "print('hello from the sandbox')\n"
                              "plt.figure(figsize=(5, 3)); plt.plot([1, 4, 2, 5]); plt.show()")
    assert await cell.get_attribute("data-status") == "ok"
    assert "hello from the sandbox" in await cell.locator(".output.stdout").inner_text()
    assert await cell.locator(".cell-prompt").inner_text() == "[1]"
    image = cell.locator("img.output-image")
    src = await image.get_attribute("src")
    assert src and src.startswith("data:image/png;base64,")
    width, height = png_size(base64.b64decode(src.split(",", 1)[1]))
    assert width > 100 and height > 100
    # The browser decoded it too.
    assert await image.evaluate("img => img.complete && img.naturalWidth") == width
    await ui.screenshot(page, "ui-plot")

    # Delete it from the list: two clicks (the first one arms the button).
    await item.locator(".delete").click()
    await item.locator(".delete.armed").click()
    await item.wait_for(state="detached")
    assert session_id not in await ui.session_ids()
    assert await page.locator("#welcome").is_visible()


async def test_transcript_renders_dataframe_traceback_and_streams(ui: Ui) -> None:
    session_id = await ui.create_session()
    page = await ui.signed_in_page()
    await ui.open_session(page, session_id)
    cell = await ui.run(page, (
        "import numpy as np, pandas as pd\n"
        "df = pd.DataFrame({'city': ['Oslo', 'Lima', 'Pune', 'Perth'],\n"
        "                   'temp_c': [4.5, 19.2, 31.0, 22.8],\n"
        "                   'rain_mm': [2.1, 0.0, 7.4, 0.6]})\n"
        "df"))
    assert await cell.locator("iframe.output-frame").get_attribute("sandbox") == "allow-scripts"
    table = cell.frame_locator("iframe.output-frame").locator("table")
    await table.wait_for()
    assert "Lima" in await table.inner_text()
    await page.wait_for_function(  # auto-height from the frame's report
        "() => document.querySelector('iframe.output-frame').offsetHeight > 80")

    await ui.run(page, "import matplotlib.pyplot as plt\n"
                       "x = np.linspace(0, 4 * np.pi, 300)\n"
                       "fig, ax = plt.subplots(figsize=(8, 2.8))\n"
                       "ax.plot(x, np.sin(x), label='sin'); ax.plot(x, np.cos(x), label='cos')\n"
                       "ax.legend(loc='upper right'); ax.set_title('Signals'); plt.show()")
    stream = await ui.run(page, "import sys\nprint('rows:', len(df))\n"
                                "print('a warning', file=sys.stderr)")
    assert "rows: 4" in await stream.locator(".output.stdout").inner_text()
    assert "a warning" in await stream.locator(".output.stderr").inner_text()
    cell = await ui.run(page, "def mean_of(values):\n    return sum(values) / len(values)\n\n"
                              "mean_of([])")
    assert await cell.get_attribute("data-status") == "error"
    error = cell.locator(".output.error")
    text = await error.inner_text()
    assert "ZeroDivisionError" in text and "\x1b" not in text
    assert await error.locator("span[class*='ansi-fg-']").count() > 0  # colours became spans

    await page.wait_for_timeout(300)  # let the frames settle their heights
    await ui.screenshot(page, "ui-transcript")
    # The README's picture: the table, the chart and the streams, on a taller page.
    await page.set_viewport_size({"width": 1360, "height": 1180})
    await page.evaluate("document.getElementById('transcript').scrollTop = 0")
    await page.fill("#code", "df.describe()")
    await page.wait_for_timeout(200)
    path = await ui.screenshot(page, "ui-overview")
    if os.environ.get("REPLGATE_UPDATE_DOCS_SCREENSHOT"):
        shutil.copyfile(path, REPO / "docs" / "ui.png")


async def test_watch_shows_executions_of_other_clients_live(ui: Ui) -> None:
    session_id = await ui.create_session()
    answer = await ui.api("POST", f"/v1/sessions/{session_id}/execute",
                          json={"code": "print('ran before the page opened')"})
    assert answer.json()["status"] == "ok"
    page = await ui.signed_in_page()
    await ui.open_session(page, session_id)
    # The history first...
    await page.wait_for_selector(".output.stdout:has-text('ran before the page opened')")

    # ...then an HTTP client's execution, streamed while it runs.
    client = asyncio.create_task(ui.api("POST", f"/v1/sessions/{session_id}/execute", json={
        "code": "import time\nprint('tick-1', flush=True)\ntime.sleep(3)\nprint('tick-2')"}))
    try:
        await page.wait_for_selector(".output.stdout:has-text('tick-1')", timeout=15_000)
        assert not client.done(), "tick-1 should show while the execution still runs"
        live_cell = page.locator(".cell", has_text="tick-1")
        assert await live_cell.get_attribute("data-status") == "running"
        assert await page.locator("#session-status").inner_text() == "busy"
        await ui.screenshot(page, "ui-watch-live")
    finally:
        answer = await asyncio.wait_for(client, 30)
    assert answer.json()["status"] == "ok"
    await page.wait_for_selector(".cell[data-status=ok] .output.stdout:has-text('tick-2')")

    # Another browser runs code: this one sees it.
    other = await ui.signed_in_page()
    await ui.open_session(other, session_id)
    await ui.run(other, "print('from the other browser')")
    await page.wait_for_selector(
        ".cell[data-status=ok] .output.stdout:has-text('from the other browser')")
    assert await page.locator("#transcript .cell").count() == 3


ATTACK = r"""
from IPython.display import HTML, display
display(HTML('''<p id="payload">payload rendered</p>
<script>
var report = {};
function attempt(name, f) {
  try { report[name] = String(f()); } catch (e) { report[name] = "blocked: " + e.name; }
}
attempt("key", function () { return localStorage.getItem("replgate.apiKey"); });
attempt("parentKey", function () { return parent.localStorage.getItem("replgate.apiKey"); });
attempt("topKey", function () { return top.localStorage.getItem("replgate.apiKey"); });
attempt("cookie", function () { return document.cookie; });
attempt("title", function () { top.document.title = "pwned"; return "set"; });
attempt("dom", function () { return parent.document.body.innerHTML.length; });
var key = report.parentKey;
attempt("fetch", function () {
  fetch("/v1/sessions", {method: "POST", body: "{}",
      headers: {"Authorization": "Bearer " + key, "Content-Type": "application/json"}})
    .then(function (r) { parent.postMessage({xss: {fetchStatus: r.status}}, "*"); },
          function (e) { parent.postMessage({xss: {fetchStatus: "blocked: " + e.name}}, "*"); });
  return "sent";
});
attempt("beacon", function () { return navigator.sendBeacon("/v1/sessions", "{}"); });
attempt("image", function () { new Image().src = "/v1/sessions?token=" + key; return "set"; });
attempt("navigate", function () { top.location.href = "/healthz"; return "set"; });
parent.postMessage({xss: report}, "*");
</script>
<img src="x" onerror="top.document.title='pwned-by-img'">'''))
"""


async def test_display_html_script_cannot_read_key_or_call_api(ui: Ui) -> None:
    session_id = await ui.create_session()
    page = await ui.signed_in_page()
    await ui.open_session(page, session_id)
    sessions_before = await ui.session_ids()
    title, url = await page.title(), page.url
    # The test listens to what the frame says; the page itself heeds nothing but heights.
    await page.evaluate("""() => { window.__reports = [];
        addEventListener('message', e => e.data && e.data.xss && __reports.push(e.data.xss)); }""")
    frame_requests: list[str] = []
    page.on("request", lambda r: frame_requests.append(r.url)
            if r.frame != page.main_frame and not r.url.startswith("data:") else None)

    cell = await ui.run(page, ATTACK)
    assert await cell.get_attribute("data-status") == "ok"
    await cell.frame_locator("iframe.output-frame").locator("#payload").wait_for()
    assert await cell.locator("iframe.output-frame").get_attribute("sandbox") == "allow-scripts"

    # The script did run (it reported back), and everything it tried failed.
    await page.wait_for_function("() => window.__reports.some(r => 'fetchStatus' in r)")
    await page.wait_for_timeout(1000)  # time for anything that did get out to arrive
    reports = await page.evaluate("window.__reports")
    report = next(r for r in reports if "key" in r)
    fetch_status = next(r["fetchStatus"] for r in reports if "fetchStatus" in r)
    for name in ("key", "parentKey", "topKey", "cookie", "title", "dom"):
        assert report[name].startswith("blocked: "), (name, report)
    assert ui.key not in json.dumps(reports)
    assert str(fetch_status).startswith("blocked: "), fetch_status
    assert await ui.session_ids() == sessions_before
    assert await page.title() == title == "replgate"
    assert page.url == url
    # The frame may still fire key-less requests (an <img src> at the API gets a 401); what
    # must never leave it is the key, and no API call with it may happen (sessions unchanged).
    assert not [u for u in frame_requests if ui.key in u], frame_requests
    assert await page.evaluate("localStorage.getItem('replgate.apiKey')") == ui.key
    await ui.screenshot(page, "ui-xss")


async def test_upload_file_lists_it_and_downloads_it(ui: Ui, tmp_path: Path) -> None:
    session_id = await ui.create_session()
    page = await ui.signed_in_page()
    await ui.open_session(page, session_id)
    await page.set_input_files("#upload-input", files=[
        {"name": "data.csv", "mimeType": "text/csv", "buffer": b"a,b\n1,2\n"}])
    await page.locator(".file-link[data-path='data.csv']").wait_for()
    cell = await ui.run(page, "print(open('data.csv').read().splitlines()[1])\n"
                              "import os; os.makedirs('out', exist_ok=True)\n"
                              "open('out/result.txt', 'w').write('42')")
    assert "1,2" in await cell.locator(".output.stdout").inner_text()
    await page.locator(".file-link[data-path='out/result.txt']").wait_for()

    async with page.expect_download() as download_info:
        await page.click(".file-link[data-path='out/result.txt']")
    download = await download_info.value
    assert download.suggested_filename == "result.txt"
    await download.save_as(tmp_path / "result.txt")
    assert (tmp_path / "result.txt").read_text() == "42"

    async with page.expect_download() as download_info:
        await page.click("#download-notebook")
    download = await download_info.value
    assert download.suggested_filename.endswith(".ipynb")
    await download.save_as(tmp_path / "session.ipynb")
    notebook = json.loads((tmp_path / "session.ipynb").read_text())
    assert notebook["nbformat"] == 4
    assert any("data.csv" in "".join(c["source"]) for c in notebook["cells"])


async def test_cell_status_shows_truncation_and_interrupt(ui: Ui) -> None:
    session_id = await ui.create_session()
    page = await ui.signed_in_page()
    await ui.open_session(page, session_id)
    cell = await ui.run(page, "print('x' * 100_000)")
    assert await cell.get_attribute("data-status") == "ok"
    assert "truncated" in await cell.locator(".notice.truncated").inner_text()
    assert len(await cell.locator(".output.stdout").inner_text()) < 100_000

    await page.fill("#code", "import time\nprint('sleeping', flush=True)\ntime.sleep(60)")
    await page.press("#code", "Shift+Enter")
    await page.wait_for_selector(".cell[data-status=running] .output.stdout:has-text('sleeping')")
    started = time.monotonic()
    await page.click("#interrupt")
    await page.wait_for_selector(".cell[data-status=interrupted]", timeout=20_000)
    assert time.monotonic() - started < 15
