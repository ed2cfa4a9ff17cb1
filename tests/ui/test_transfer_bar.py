"""The web UI's bar for a pause or resume of the watched session (real gateway, Chromium)."""

from __future__ import annotations

from typing import Any

from tests.ui.conftest import Ui

HELD_MIB = 600
"""Enough that a pause or resume lasts several progress reports (random floats are moved as
they are, at the disk's speed: 200 MiB took about 0.3 s)."""
HOLD = f"import numpy as np\nbig = np.random.default_rng(3).random({HELD_MIB} * 2**20 // 8)\n"

# Every change of the bar, as the page shows it: a MutationObserver misses none, where polling
# from the test could miss a state that lasted less than its interval.
RECORD_BAR = """() => {
  window.__bar = [];
  const box = document.getElementById("transfer");
  const note = () => window.__bar.push({
    hidden: box.hidden, operation: box.dataset.operation, state: box.dataset.state,
    pct: Number(box.getAttribute("aria-valuenow")),
    text: document.getElementById("transfer-text").textContent,
  });
  new MutationObserver(note).observe(box, { attributes: true, subtree: true,
                                            childList: true, characterData: true });
}"""


async def bar_until_end(page: Any, operation: str) -> list[dict[str, Any]]:
    """What the bar showed for ``operation``, once it showed that transfer's end."""
    await page.wait_for_function(
        "op => window.__bar.some(b => b.operation === op && b.state !== 'running')",
        arg=operation, timeout=120_000)
    shown: list[dict[str, Any]] = await page.evaluate("window.__bar")
    return [b for b in shown if b["operation"] == operation and not b["hidden"]]


def assert_filled(shown: list[dict[str, Any]], verb: str, past: str) -> None:
    running = [b for b in shown if b["state"] == "running"]
    assert running and all(b["text"].startswith(f"{verb}: ") for b in running), shown
    assert [b["pct"] for b in running] == sorted(b["pct"] for b in running), shown
    assert any(0 < b["pct"] < 100 for b in running), shown  # it moved, not only jumped
    end = next(b for b in shown if b["state"] != "running")
    assert end["state"] == "done" and end["pct"] == 100, shown
    assert end["text"].startswith(f"{past}: ") and end["text"].endswith("MB"), shown


async def test_the_bar_follows_a_pause_and_the_resume_of_the_watched_session(ui: Ui) -> None:
    session_id = await ui.create_session()
    ran = await ui.api("POST", f"/v1/sessions/{session_id}/execute",
                       json={"code": HOLD, "timeout_s": 120})
    assert ran.json()["status"] == "ok", ran.text
    page = await ui.signed_in_page()
    await ui.open_session(page, session_id)
    assert await page.locator("#transfer").is_hidden()
    await page.evaluate(RECORD_BAR)

    paused = await ui.api("POST", f"/v1/sessions/{session_id}/pause")  # asked elsewhere
    assert paused.status_code == 200, paused.text
    assert_filled(await bar_until_end(page, "pause"), "Pausing", "Paused")
    await page.wait_for_selector("#session-status.badge-paused")
    await page.wait_for_selector("#transfer", state="hidden")

    # Code run from the page resumes the session: the same bar, then the cell's output.
    cell = await ui.run(page, "print(big.size)")
    assert_filled(await bar_until_end(page, "resume"), "Resuming", "Resumed")
    assert (await cell.locator(".output.stdout").inner_text()).strip() == str(HELD_MIB * 2**20 // 8)
