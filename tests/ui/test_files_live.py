"""The files panel follows the session's workspace live (real Chromium, real gateway, real sandbox):
files that commands run elsewhere write, move or remove show without a reload, and the panel
watches again after the session pauses and resumes."""

from __future__ import annotations

from typing import Any

from tests.ui.conftest import Ui


def file_link(page: Any, path: str) -> Any:
    return page.locator(f".file-link[data-path='{path}']")


async def command(ui: Ui, session_id: str, cmd: str) -> None:
    """Run ``cmd`` in the sandbox through the API, as an agent would: the page is not told."""
    answer = await ui.api("POST", f"/v1/sessions/{session_id}/commands", json={"cmd": cmd})
    assert answer.status_code == 200 and answer.json()["exit_code"] == 0, answer.text


async def watched_page(ui: Ui, session_id: str) -> Any:
    page = await ui.signed_in_page()
    await ui.open_session(page, session_id)
    await page.wait_for_selector("#file-list[data-watch=live]", state="attached")
    return page


async def test_files_written_by_a_command_show_without_a_reload(ui: Ui) -> None:
    session_id = await ui.create_session()
    page = await watched_page(ui, session_id)
    assert await page.locator("#files-empty").is_visible()
    # Counted: the page lists its files again on a change, not on a timer.
    await page.evaluate("""() => { window.__listings = 0; const fetch0 = window.fetch;
      window.fetch = (url, ...rest) => { if (/\\/files$/.test(url)) window.__listings += 1;
                                         return fetch0(url, ...rest); }; }""")

    await command(ui, session_id, "mkdir -p out && echo 42 > out/answer.txt")
    await file_link(page, "out/answer.txt").wait_for()
    assert await page.locator("#files-empty").is_hidden()

    await command(ui, session_id, "mv out/answer.txt moved.txt")
    await file_link(page, "moved.txt").wait_for()
    await file_link(page, "out/answer.txt").wait_for(state="detached")

    await command(ui, session_id, "rm moved.txt")
    await file_link(page, "moved.txt").wait_for(state="detached")

    # A burst of changes makes a listing or two, not one per change.
    before = await page.evaluate("window.__listings")
    await command(ui, session_id, "for i in $(seq 1 40); do echo $i > f$i.txt; done")
    await file_link(page, "f40.txt").wait_for()
    await page.wait_for_timeout(800)
    assert 1 <= await page.evaluate("window.__listings") - before <= 4


async def test_a_file_the_terminal_writes_shows_in_the_panel(ui: Ui) -> None:
    session_id = await ui.create_session()
    page = await watched_page(ui, session_id)
    await page.click("#tab-terminal")
    await page.wait_for_selector("#terminal-state[data-state=live]")
    await page.click("#terminal")
    await page.keyboard.type("echo from the terminal > typed.txt")
    await page.keyboard.press("Enter")
    await file_link(page, "typed.txt").wait_for()


async def test_the_panel_watches_again_after_a_pause_and_resume(ui: Ui) -> None:
    session_id = await ui.create_session()
    page = await watched_page(ui, session_id)

    paused = await ui.api("POST", f"/v1/sessions/{session_id}/pause")
    assert paused.status_code == 200, paused.text
    await page.wait_for_selector("#file-list[data-watch=ended]", state="attached")
    await page.wait_for_selector("#session-status.badge-paused")
    # The page waits: a watch opened again now would resume the session.
    await page.wait_for_timeout(2000)
    status = await ui.api("GET", f"/v1/sessions/{session_id}")
    assert status.json()["status"] == "paused", status.text
    assert await page.get_attribute("#file-list", "data-watch") == "ended"

    resumed = await ui.api("POST", f"/v1/sessions/{session_id}/resume")
    assert resumed.status_code == 200, resumed.text
    await page.wait_for_selector("#file-list[data-watch=live]", state="attached")
    await command(ui, session_id, "echo back > after-resume.txt")
    await file_link(page, "after-resume.txt").wait_for()


async def test_a_paused_session_is_not_resumed_by_opening_its_page(ui: Ui) -> None:
    session_id = await ui.create_session()
    paused = await ui.api("POST", f"/v1/sessions/{session_id}/pause")
    assert paused.status_code == 200, paused.text
    page = await ui.signed_in_page()
    await ui.open_session(page, session_id)
    await page.wait_for_selector("#file-list[data-watch=waiting]", state="attached")
    await page.wait_for_timeout(2000)  # a watch opened now would have resumed it by then
    status = await ui.api("GET", f"/v1/sessions/{session_id}")
    assert status.json()["status"] == "paused", status.text

    resumed = await ui.api("POST", f"/v1/sessions/{session_id}/resume")
    assert resumed.status_code == 200, resumed.text
    await page.wait_for_selector("#file-list[data-watch=live]", state="attached")
    await command(ui, session_id, "echo hello > hello.txt")
    await file_link(page, "hello.txt").wait_for()
