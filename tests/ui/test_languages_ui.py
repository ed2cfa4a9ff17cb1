"""The web UI's language picker: each cell runs in the language chosen for it, and says which
(real Chromium, real gateway, the default image: every language it offers)."""

from __future__ import annotations

from tests.ui.conftest import Ui


async def test_each_cell_runs_in_the_language_picked_for_it(ui: Ui) -> None:
    session_id = await ui.create_session()
    page = await ui.signed_in_page()
    await ui.open_session(page, session_id)
    picker = page.locator("#language")
    # The options come from the gateway's kernelspecs. A function, not an expression: Playwright
    # evals an expression on every poll, which the page's CSP (no 'unsafe-eval') refuses once
    # a poll runs outside DevTools' first evaluation, i.e. whenever the options are late.
    await page.wait_for_function(
        "() => document.querySelectorAll('#language option').length > 1")
    assert await picker.locator("option").all_inner_texts() == [
        "Python", "R", "JavaScript", "TypeScript", "Java", "Bash"]

    await picker.select_option("bash")
    assert await page.locator("#code").get_attribute("placeholder") == "ls -la"
    shell = await ui.run(page, "x=5\necho $((x * 2))")
    await picker.select_option("python")
    python = await ui.run(page, "print(globals().get('x'))")

    assert await shell.get_attribute("data-language") == "bash"
    assert await shell.locator(".cell-language").inner_text() == "Bash"
    assert "10" in await shell.locator(".cell-outputs").inner_text()
    assert await shell.locator(".cell-code").inner_text() == "x=5\necho $((x * 2))"
    assert await python.get_attribute("data-language") == "python"
    assert await python.locator(".cell-language").count() == 0
    assert (await python.locator(".cell-outputs").inner_text()).strip() == "None"
    history = (await ui.api("GET", f"/v1/sessions/{session_id}/executions")).json()
    assert [h["result"]["language"] for h in history] == ["bash", "python"]
    await ui.screenshot(page, "ui-language-picker")

    # Another page replays the history: the bash cell is tagged from its done frame.
    again = await ui.signed_in_page()
    await ui.open_session(again, session_id)
    replayed = again.locator("#transcript .cell").first
    await replayed.locator(".cell-meta .duration").wait_for()
    assert await replayed.get_attribute("data-language") == "bash"
    assert await replayed.locator(".cell-language").inner_text() == "Bash"
